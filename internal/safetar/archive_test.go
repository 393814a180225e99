package safetar

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// node is what a test sees of one path of a tree.
type node struct {
	mode  fs.FileMode
	link  string
	sum   [sha256.Size]byte
	mtime time.Time
}

// snapshot describes the tree at root, keyed by path relative to it,
// without following links.
func snapshot(t testing.TB, root string) map[string]node {
	t.Helper()
	tree := map[string]node{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		n := node{mode: fi.Mode(), mtime: fi.ModTime()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			n.link, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			n.sum = sha256.Sum256(b)
		}
		tree[rel] = n
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// makeTree makes, under root, a tree of every kind Archive carries: modes,
// links inside the tree (relative, absolute, dangling), empty and read-only
// directories, a large file, and set mtimes.
func makeTree(t testing.TB, root string, large int) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "sub", "deeper"), 0o755))
	must(os.Mkdir(filepath.Join(root, "empty"), 0o700))
	must(os.Mkdir(filepath.Join(root, "ro"), 0o755))
	for p, mode := range map[string]fs.FileMode{
		"plain": 0o644, "exec": 0o755, "private": 0o600, "readonly": 0o444, "sub/deeper/f": 0o640, "ro/inside": 0o644, "emptyfile": 0o644,
	} {
		body := "contents of " + p + "\n"
		if p == "emptyfile" {
			body = ""
		}
		must(os.WriteFile(filepath.Join(root, p), []byte(body), mode))
		must(os.Chmod(filepath.Join(root, p), mode)) // past the umask
	}
	big := make([]byte, large)
	rand.Read(big)
	must(os.WriteFile(filepath.Join(root, "sub", "large.bin"), big, 0o644))
	for l, target := range map[string]string{
		"link-rel": "sub/deeper/f", "sub/up": "../plain", "link-dir": "sub", "dangling": "no/such/file", "link-abs": "/etc/passwd",
	} {
		must(os.Symlink(target, filepath.Join(root, l)))
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{"plain", "sub/deeper/f", "empty", "sub/deeper", "ro"} {
		must(os.Chtimes(filepath.Join(root, p), old, old))
	}
	ts := unix.NsecToTimespec(old.Add(time.Hour).UnixNano())
	must(unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, "link-rel"), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	must(os.Chmod(filepath.Join(root, "ro"), 0o555))
}

// TestRoundTrip: a tree archived and extracted comes out the same: types,
// modes, link targets, contents and mtimes, under its own name or under
// Top's.
func TestRoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "tree")
	makeTree(t, src, 4*copyBytes+12345)
	want := snapshot(t, src)
	for _, tc := range []struct{ name, top, out string }{
		{"same name", "", "tree"},
		{"renamed with Top", "renamed", "renamed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := Archive(&buf, src, "tree", 0); err != nil {
				t.Fatal(err)
			}
			dst := t.TempDir()
			if err := extract(t, dst, buf.Bytes(), Options{Top: tc.top}); err != nil {
				t.Fatal(err)
			}
			got := snapshot(t, filepath.Join(dst, tc.out))
			if len(got) != len(want) {
				t.Errorf("%d paths extracted, want %d: %v", len(got), len(want), keys(got))
			}
			for p, w := range want {
				g, ok := got[p]
				switch {
				case !ok:
					t.Errorf("%s is missing", p)
				case g.mode != w.mode:
					t.Errorf("%s: mode %v, want %v", p, g.mode, w.mode)
				case g.link != w.link:
					t.Errorf("%s: links to %q, want %q", p, g.link, w.link)
				case g.sum != w.sum:
					t.Errorf("%s: contents differ", p)
				case g.mtime.Sub(w.mtime).Abs() >= time.Microsecond: // within a microsecond: Extract sets times with futimes
					t.Errorf("%s: mtime %v, want %v", p, g.mtime, w.mtime)
				}
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// tarEntries lists a stream's entries as "name type linkname".
func tarEntries(t testing.TB, stream []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(stream))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %c %s", hdr.Name, hdr.Typeflag, hdr.Linkname))
	}
}

// TestArchive: links are archived as links, and a link to a directory
// outside is never followed, at the top of the tree or inside it.
func TestArchive(t *testing.T) {
	parent := t.TempDir()
	src, outside := filepath.Join(parent, "src"), filepath.Join(parent, "outside")
	for _, d := range []string{src, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"out": outside, "out-rel": "../outside", "secret": filepath.Join(outside, "secret")} {
		if err := os.Symlink(target, filepath.Join(src, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(parent, "top-link")); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, path string
		want       []string
	}{
		{"a tree", src, []string{"src/ 5 ", "src/f 0 ", "src/out 2 " + outside, "src/out-rel 2 ../outside", "src/secret 2 " + filepath.Join(outside, "secret")}},
		{"a link to a dir outside", filepath.Join(parent, "top-link"), []string{"top-link 2 " + outside}},
		{"a link to a file", filepath.Join(src, "secret"), []string{"secret 2 " + filepath.Join(outside, "secret")}},
		{"a file", filepath.Join(src, "f"), []string{"f 0 "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			done := make(chan error, 1)
			go func() { done <- Archive(&buf, tc.path, filepath.Base(tc.path), 0) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Archive hangs (opened a FIFO?)")
			}
			if got := tarEntries(t, buf.Bytes()); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestArchiveMaxBytes: past maxBytes, Archive fails with ErrTooLarge.
func TestArchiveMaxBytes(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(src, n), bytes.Repeat([]byte("x"), 500), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		max    int64
		tooBig bool
	}{{0, false}, {1000, false}, {999, true}, {1, true}} {
		err := Archive(io.Discard, src, "src", tc.max)
		if tc.tooBig != (err != nil) || tc.tooBig && (!errors.Is(err, ErrTooLarge) || !errdefs.IsOutOfRange(err)) {
			t.Errorf("max %d: %v, want too large: %v", tc.max, err, tc.tooBig)
		}
	}
}

// TestArchiveMissing: a path that is not there fails (not found).
func TestArchiveMissing(t *testing.T) {
	if err := Archive(io.Discard, filepath.Join(t.TempDir(), "nope"), "nope", 0); !errors.Is(err, fs.ErrNotExist) || !errdefs.IsNotFound(err) {
		t.Errorf("Archive of a missing path: %v, want not exist", err)
	}
}

// TestArchiveRefusesSpecialFiles: a FIFO, a socket or a device, at the top
// or inside a tree, fails the archive with a TypeError naming it (an
// invalid argument), never an archive short of it; Check says the same of
// the top.
func TestArchiveRefusesSpecialFiles(t *testing.T) {
	parent := t.TempDir()
	tree := filepath.Join(parent, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(tree, "sub", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(parent, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(parent, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(parent, "fifo"), filepath.Join(parent, "fifo") + " is a FIFO"},
		{filepath.Join(parent, "sock"), filepath.Join(parent, "sock") + " is a socket"},
		{"/dev/null", "/dev/null is a character device"},
		{"/dev/zero", "/dev/zero is a character device"},
		{tree, filepath.Join(tree, "sub", "fifo") + " is a FIFO"},
	} {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- Archive(io.Discard, tc.path, filepath.Base(tc.path), 0) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Archive hangs (opened a FIFO?)")
			}
			var te *TypeError
			if !errors.As(err, &te) || !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), tc.want+": only regular files") {
				t.Errorf("Archive: %v, want a TypeError saying %q", err, tc.want)
			}
			if err := Check(tc.path); !errors.As(err, &te) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("Check: %v, want %q", err, tc.want)
			}
		})
	}
	if err := os.Remove(filepath.Join(tree, "sub", "fifo")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(tree, "sub", "null")); err != nil {
		t.Fatal(err)
	}
	if err := Check(tree); err != nil {
		t.Errorf("Check of a tree of a file, a directory and a link to a device: %v", err)
	}
	missing := filepath.Join(parent, "missing")
	if err := Check(missing); !errors.Is(err, fs.ErrNotExist) || !errdefs.IsNotFound(err) {
		t.Errorf("Check of a missing path: %v, want not found", err)
	}
}
