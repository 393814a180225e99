package safetar

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestExtractRefuses: entries that name something outside the root, or
// that are not a directory, regular file or symbolic link, are refused as
// invalid arguments, and nothing is written outside the root.
func TestExtractRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries func(outside string) []entry
		want    string
	}{
		{"absolute file", func(o string) []entry { return []entry{file(filepath.Join(o, "f"), "x")} }, "an absolute name"},
		{"absolute dir", func(o string) []entry { return []entry{dir(o + "/d/")} }, "an absolute name"},
		{"dot dot", func(string) []entry { return []entry{file("../outside/f", "x")} }, `".."`},
		{"dot dot inside", func(string) []entry { return []entry{dir("a/"), file("a/../../outside/f", "x")} }, `".."`},
		{"dot dot that cleans inside", func(string) []entry { return []entry{file("a/../f", "x")} }, `".."`},
		{"dot dot dir", func(string) []entry { return []entry{dir("../outside/d/")} }, `".."`},
		{"hard link", func(string) []entry { return []entry{file("f", "x"), hardlink("h", "f")} }, "only directories, regular files and symbolic links"},
		{"hard link outside", func(o string) []entry { return []entry{hardlink("h", filepath.Join(o, "keep"))} }, "only directories"},
		{"char device", func(string) []entry { return []entry{{name: "null", typ: tar.TypeChar, mode: 0o666}} }, "only directories"},
		{"block device", func(string) []entry { return []entry{{name: "sda", typ: tar.TypeBlock, mode: 0o660}} }, "only directories"},
		{"fifo", func(string) []entry { return []entry{{name: "fifo", typ: tar.TypeFifo, mode: 0o644}} }, "only directories"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, root, outside := escapeLayout(t)
			err := extract(t, root, buildTar(t, tc.entries(outside)...), Options{})
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Extract: %v, want an invalid argument saying %q", err, tc.want)
			}
			assertOutsideUntouched(t, parent, outside)
			for _, n := range []string{"h", "null", "sda", "fifo"} {
				if _, err := os.Lstat(filepath.Join(root, n)); err == nil {
					t.Errorf("%s was made in the root", n)
				}
			}
		})
	}
}

// TestExtractNeverGoesThroughALink: an entry whose path goes through a
// symbolic link, one that was in the root before or one that the stream
// itself made, is refused, and nothing is written where the link points.
func TestExtractNeverGoesThroughALink(t *testing.T) {
	for _, tc := range []struct {
		name    string
		before  map[string]string // link -> target, made in the root first ("OUT": outside)
		entries []entry
		top     string
	}{
		{"file through an absolute link there before", map[string]string{"x": "OUT"}, []entry{file("x/f", "evil")}, ""},
		{"file through a relative link there before", map[string]string{"x": "../outside"}, []entry{file("x/f", "evil")}, ""},
		{"dir through a link there before", map[string]string{"x": "OUT"}, []entry{dir("x/d/")}, ""},
		{"dir entry on a link there before", map[string]string{"x": "OUT"}, []entry{{name: "x/", typ: tar.TypeDir, mode: 0o700}}, ""},
		{"link through a link there before", map[string]string{"x": "OUT"}, []entry{symlink("x/l", "/")}, ""},
		{"deep: file through a link in a dir", map[string]string{"a": "", "a/x": "OUT"}, []entry{file("a/x/f", "evil")}, ""},
		{"top renamed onto a link there before", map[string]string{"x": "OUT"}, []entry{dir("d/"), file("d/f", "evil")}, "x"},
		{"link then file through it", nil, []entry{symlink("l", "../outside"), file("l/f", "evil")}, ""},
		{"link then dir through it", nil, []entry{symlink("l", "../outside"), dir("l/d/"), file("l/d/f", "evil")}, ""},
		{"link then dir entry on it", nil, []entry{symlink("l", "../outside"), {name: "l/", typ: tar.TypeDir, mode: 0o700}}, ""},
		{"absolute link then file through it", nil, []entry{symlink("l", "OUT"), file("l/keep", "evil")}, ""},
		{"dir, link over it refused, file", nil, []entry{dir("d/"), symlink("d", "../outside"), file("d/f", "x")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, root, outside := escapeLayout(t)
			for _, l := range sortedKeys(tc.before) {
				target := tc.before[l]
				if target == "" {
					if err := os.Mkdir(filepath.Join(root, l), 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if target == "OUT" {
					target = outside
				}
				if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
					t.Fatal(err)
				}
			}
			entries := append([]entry(nil), tc.entries...)
			for i := range entries {
				if entries[i].link == "OUT" {
					entries[i].link = outside
				}
			}
			err := extract(t, root, buildTar(t, entries...), Options{Top: tc.top})
			if err == nil {
				t.Fatal("Extract went through a link: want an error")
			}
			if !errdefs.IsInvalidArgument(err) && !errdefs.IsAlreadyExists(err) {
				t.Errorf("Extract: %v, want an invalid argument (or already exists)", err)
			}
			assertOutsideUntouched(t, parent, outside)
		})
	}
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	// Parents before children: shorter first.
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if len(ks[j]) < len(ks[i]) {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

// TestExtractReplacesALink: a file or link entry over an existing link
// replaces the link itself; what the link pointed to is never written.
func TestExtractReplacesALink(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target string // of the link f in the root before ("OUT/...": under outside)
		entry  entry
	}{
		{"file over a link to a file outside", "OUT/keep", file("f", "new")},
		{"file over a link to a missing file outside", "OUT/new", file("f", "new")},
		{"file over a relative link outside", "../outside/keep", file("f", "new")},
		{"file over a link to a dir outside", "OUT", file("f", "new")},
		{"file over a dangling link", "/nonexistent/flmbox", file("f", "new")},
		{"link over a link", "OUT/keep", symlink("f", "elsewhere")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, root, outside := escapeLayout(t)
			target := strings.Replace(tc.target, "OUT", outside, 1)
			if err := os.Symlink(target, filepath.Join(root, "f")); err != nil {
				t.Fatal(err)
			}
			if err := extract(t, root, buildTar(t, tc.entry), Options{}); err != nil {
				t.Fatalf("Extract: %v", err)
			}
			fi, err := os.Lstat(filepath.Join(root, "f"))
			if err != nil {
				t.Fatal(err)
			}
			switch tc.entry.typ {
			case tar.TypeReg:
				b, _ := os.ReadFile(filepath.Join(root, "f"))
				if !fi.Mode().IsRegular() || string(b) != "new" {
					t.Errorf("f is %v holding %q, want a regular file holding \"new\"", fi.Mode(), b)
				}
			case tar.TypeSymlink:
				if l, _ := os.Readlink(filepath.Join(root, "f")); l != "elsewhere" {
					t.Errorf("f links to %q, want elsewhere", l)
				}
			}
			assertOutsideUntouched(t, parent, outside)
		})
	}
}

// TestExtractKeepsADirectory: a file or link entry over an existing
// directory is refused (already exists); a directory entry over one keeps it
// and what it holds.
func TestExtractKeepsADirectory(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "d", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "d", "old"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, e := range []entry{file("d", "x"), symlink("d", "/"), file("d/sub", "x")} {
		if err := extract(t, root, buildTar(t, e), Options{}); !errdefs.IsAlreadyExists(err) {
			t.Errorf("%s over a directory: %v, want already exists", e.name, err)
		}
	}
	if err := extract(t, root, buildTar(t, dir("d/"), file("d/new", "new")), Options{}); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"d/old": "old", "d/new": "new"} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v, want %q", f, b, err, want)
		}
	}
}

// TestExtractTop: Top replaces the first component of every name.
func TestExtractTop(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		top     string
		want    map[string]string // path -> contents ("/": a directory)
		absent  []string
	}{
		{"a file", []entry{file("data.csv", "a,b\n")}, "in.csv", map[string]string{"in.csv": "a,b\n"}, []string{"data.csv"}},
		{"a tree", []entry{dir("out/"), dir("out/sub/"), file("out/sub/f", "f")}, "res",
			map[string]string{"res": "/", "res/sub": "/", "res/sub/f": "f"}, []string{"out"}},
		{"a tree without a dir entry", []entry{file("out/f", "f")}, "res", map[string]string{"res/f": "f"}, []string{"out"}},
		{"./ names", []entry{dir("./"), dir("./out/"), file("./out/f", "f")}, "res", map[string]string{"res/f": "f"}, []string{"out"}},
		{"no top", []entry{file("data.csv", "x")}, "", map[string]string{"data.csv": "x"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := extract(t, root, buildTar(t, tc.entries...), Options{Top: tc.top}); err != nil {
				t.Fatal(err)
			}
			for p, want := range tc.want {
				fi, err := os.Lstat(filepath.Join(root, p))
				switch {
				case err != nil:
					t.Errorf("%s: %v", p, err)
				case want == "/":
					if !fi.IsDir() {
						t.Errorf("%s is %v, want a directory", p, fi.Mode())
					}
				default:
					if b, _ := os.ReadFile(filepath.Join(root, p)); string(b) != want {
						t.Errorf("%s holds %q, want %q", p, b, want)
					}
				}
			}
			for _, p := range tc.absent {
				if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists (%v): Top did not rename it", p, err)
				}
			}
		})
	}
}

// TestExtractMaxBytes: files' contents together up to MaxBytes are
// extracted; past it, Extract fails with ErrTooLarge (an out-of-range
// error) before writing the file that goes over.
func TestExtractMaxBytes(t *testing.T) {
	half := strings.Repeat("x", 500)
	for _, tc := range []struct {
		name    string
		entries []entry
		max     int64
		tooBig  bool
	}{
		{"exactly the bound", []entry{file("a", half), file("b", half)}, 1000, false},
		{"one byte over", []entry{file("a", half), file("b", half+"x")}, 1000, true},
		{"one file over", []entry{file("a", half+half+"x")}, 1000, true},
		{"links and dirs are free", []entry{dir("d/"), symlink("d/l", strings.Repeat("t", 900)), file("d/a", half)}, 600, false},
		{"no bound", []entry{file("a", half+half+half)}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			err := extract(t, root, buildTar(t, tc.entries...), Options{MaxBytes: tc.max})
			if !tc.tooBig {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrTooLarge) || !errdefs.IsOutOfRange(err) {
				t.Fatalf("Extract: %v, want ErrTooLarge", err)
			}
			last := tc.entries[len(tc.entries)-1].name
			if _, err := os.Lstat(filepath.Join(root, last)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s, the file past the bound, was written (%v)", last, err)
			}
		})
	}
}

// TestExtractModes: modes are kept (set-ID bits dropped), directories'
// modes set last so that a read-only directory is filled, and a mode of an
// existing directory that a stream names.
func TestExtractModes(t *testing.T) {
	root := t.TempDir()
	stream := buildTar(t,
		entry{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		entry{name: "ro/f", typ: tar.TypeReg, mode: 0o4755, body: "suid"},
		entry{name: "ro/g", typ: tar.TypeReg, mode: 0o2640, body: "sgid"},
		entry{name: "sticky/", typ: tar.TypeDir, mode: 0o1777},
		entry{name: "secret", typ: tar.TypeReg, mode: 0o600, body: "s"},
	)
	if err := extract(t, root, stream, Options{}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		"ro":     os.ModeDir | 0o555,
		"ro/f":   0o755,
		"ro/g":   0o640,
		"sticky": os.ModeDir | os.ModeSticky | 0o777,
		"secret": 0o600,
	} {
		if fi, err := os.Lstat(filepath.Join(root, p)); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, fi.Mode(), err, want)
		}
	}
}

// TestExtractTruncated: a stream cut short fails, never passes for a whole
// one.
func TestExtractTruncated(t *testing.T) {
	stream := buildTar(t, file("a", strings.Repeat("a", 4096)), file("b", "b"))
	for _, n := range []int{100, 512, 1024, 512 + 4096 + 100} {
		if err := extract(t, t.TempDir(), stream[:n], Options{}); err == nil {
			t.Errorf("a stream cut at %d bytes of %d: no error", n, len(stream))
		}
	}
}
