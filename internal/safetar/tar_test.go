package safetar

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// entry is one entry of a tar stream built in memory by a test.
type entry struct {
	name string
	typ  byte
	mode int64
	body string
	link string // a symlink's target or a hard link's name
}

// buildTar returns the tar stream of entries, in order.
func buildTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, ModTime: time.Unix(1e9, 0)}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		switch e.typ {
		case tar.TypeReg:
			hdr.Size = int64(len(e.body))
		case tar.TypeChar, tar.TypeBlock:
			hdr.Devmajor, hdr.Devminor = 1, 3 // /dev/null
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func file(name, body string) entry { return entry{name: name, typ: tar.TypeReg, body: body} }
func dir(name string) entry        { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, to string) entry {
	return entry{name: name, typ: tar.TypeSymlink, mode: 0o777, link: to}
}
func hardlink(name, to string) entry { return entry{name: name, typ: tar.TypeLink, link: to} }

// escapeLayout returns a temporary directory holding root, where a test
// extracts, and outside, a directory beside it with one file of its own,
// "keep", that a test expects untouched.
func escapeLayout(t testing.TB) (parent, root, outside string) {
	t.Helper()
	parent = t.TempDir()
	root, outside = filepath.Join(parent, "root"), filepath.Join(parent, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	return parent, root, outside
}

// assertOutsideUntouched fails the test unless outside holds only its file
// "keep", unchanged, with its mode 0755, and parent holds only root and
// outside.
func assertOutsideUntouched(t testing.TB, parent, outside string) {
	t.Helper()
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "keep" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("something was written outside the root: %s holds %q", outside, names)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "keep" {
		t.Errorf("outside/keep was changed: %q, %v", b, err)
	}
	if fi, err := os.Lstat(outside); err != nil || fi.Mode() != os.ModeDir|0o755 {
		t.Errorf("outside's mode was changed: %v, %v", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 2 {
		t.Errorf("something was written beside the root: %v", ents)
	}
}

// openRoot opens directory p for Extract; closed when the test ends.
func openRoot(t testing.TB, p string) *os.File {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// extract extracts stream into the directory p.
func extract(t testing.TB, p string, stream []byte, o Options) error {
	t.Helper()
	return Extract(openRoot(t, p), bytes.NewReader(stream), o)
}
