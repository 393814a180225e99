package snippet

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/safetar"
	"github.com/flmbox/flmbox/snippet/wire"
)

// TestCopyKind: the kinds a copy's helper reports, which the client maps
// to errdefs kinds.
func TestCopyKind(t *testing.T) {
	t.Parallel()
	missing := safetar.Archive(io.Discard, filepath.Join(t.TempDir(), "nosuch"), "nosuch", 0)
	special := safetar.Archive(io.Discard, "/dev/null", "null", 0)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("extract big: write: %w", unix.ENOSPC), wire.CopyNoSpace},
		{fmt.Errorf("extract big: write: %w", unix.EDQUOT), wire.CopyNoSpace},
		{missing, wire.CopyNotFound},
		{fmt.Errorf("archive /etc/shadow: %w", unix.EACCES), wire.CopyPermissionDenied},
		{fmt.Errorf("extract a: %w", safetar.ErrTooLarge), wire.CopyTooLarge},
		{fmt.Errorf("a directory is in the way: %w", errdefs.ErrAlreadyExists), wire.CopyExists},
		{special, ""},
		{errors.New("other"), ""},
	} {
		if got := copyKind(tc.err); got != tc.want {
			t.Errorf("copyKind(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestCopyInNoPartialFile: a copy into a directory whose stream is cut in
// the middle of a file leaves no part of it, nor a temporary file.
func TestCopyInNoPartialFile(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 20})
	tw.Write(bytes.Repeat([]byte("x"), 1<<20))
	tw.Close()
	err := copyIn(root, root, true, 0, bytes.NewReader(buf.Bytes()[:512<<10]))
	if err == nil {
		t.Fatal("copyIn of a stream cut short: no error")
	}
	ents, _ := os.ReadDir(root)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 0 {
		t.Errorf("after a copy cut short, the directory holds %s", strings.Join(names, " "))
	}
}
