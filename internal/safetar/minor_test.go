package safetar

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// TestExtractMtimeNanoseconds: a file's and a directory's mtime come out
// to the nanosecond, as the stream (PAX) carries it and as a link's does:
// never rounded up, which makes a copy look newer than its source.
func TestExtractMtimeNanoseconds(t *testing.T) {
	mtime := time.Unix(1e9, 123456789)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX},
		{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "f", Mode: 0o777, ModTime: mtime, Format: tar.FormatPAX},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	root := t.TempDir()
	if err := extract(t, root, buf.Bytes(), Options{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/f", "d/l"} {
		if fi, err := os.Lstat(filepath.Join(root, p)); err != nil || !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mtime %v (%v), want %v", p, fi.ModTime(), err, mtime)
		}
	}
}

// TestExtractRefusesDotDotThatCleansToTheRoot: Extract's contract refuses
// names with "..": "a/.." too, which is now skipped as the stream's root.
func TestExtractRefusesDotDotThatCleansToTheRoot(t *testing.T) {
	for _, name := range []string{"a/..", "a/../", "a/b/../.."} {
		err := extract(t, t.TempDir(), buildTar(t, dir(name)), Options{})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `".."`) {
			t.Errorf("%q: %v, want refused", name, err)
		}
	}
}
