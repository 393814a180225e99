package testimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

var treeTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// node is a file of a synthetic tree.
type node struct {
	path string
	kind byte // tar type flags; TypeFifo for a fifo
	mode os.FileMode
	body string // content, or the target of a symlink or hardlink
}

// makeTree creates nodes below a new temporary directory, in order, with
// mtimes treeTime.
func makeTree(t *testing.T, nodes []node) string {
	t.Helper()
	root := t.TempDir()
	for _, n := range nodes {
		p := filepath.Join(root, n.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch n.kind {
		case tar.TypeDir:
			err = os.Mkdir(p, n.mode)
		case tar.TypeReg:
			err = os.WriteFile(p, []byte(n.body), n.mode)
		case tar.TypeSymlink:
			err = os.Symlink(n.body, p)
		case tar.TypeLink:
			err = os.Link(filepath.Join(root, n.body), p)
		case tar.TypeFifo:
			err = syscall.Mkfifo(p, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n.kind == tar.TypeDir || n.kind == tar.TypeReg {
			// Chmod after creation: the umask does not apply, and the
			// special bits are set.
			if err := os.Chmod(p, n.mode&fs.ModePerm|n.mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Times last, children before parents, so that creating a child does
	// not move its parent's mtime. Symlinks and fifos keep theirs.
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&(fs.ModeSymlink|fs.ModeNamedPipe) == 0 {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range slices.Backward(paths) {
		if err := os.Chtimes(p, treeTime, treeTime); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// tarEntry is a header and the content read from a tar stream.
type tarEntry struct {
	hdr  *tar.Header
	body string
}

func readTar(t *testing.T, r io.Reader) []tarEntry {
	t.Helper()
	var out []tarEntry
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tarEntry{hdr, string(b)})
	}
}

func names(entries []tarEntry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.hdr.Name
	}
	return out
}

// writeTar runs fill on a layerWriter over a buffer and returns the entries.
func writeTar(t *testing.T, fill func(w *layerWriter) error) ([]tarEntry, layerStats) {
	t.Helper()
	var buf bytes.Buffer
	w := newLayerWriter(&buf)
	if err := fill(w); err != nil {
		t.Fatal(err)
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	return readTar(t, &buf), w.stats
}

func TestWriteTree(t *testing.T) {
	root := makeTree(t, []node{
		{path: "z", kind: tar.TypeReg, mode: 0o644, body: "last\n"},
		{path: "a", kind: tar.TypeDir, mode: 0o755},
		{path: "a/file", kind: tar.TypeReg, mode: 0o640, body: "hello\n"},
		{path: "a/hard", kind: tar.TypeLink, body: "a/file"},
		{path: "a/link", kind: tar.TypeSymlink, body: "../z"},
		{path: "a-b", kind: tar.TypeReg, mode: 0o600, body: "dash\n"},
		{path: "b", kind: tar.TypeDir, mode: 0o700},
		{path: "b/setuid", kind: tar.TypeReg, mode: fs.ModeSetuid | 0o755, body: "#!/bin/sh\n"},
		{path: "c", kind: tar.TypeDir, mode: fs.ModeSticky | 0o777},
		{path: "fifo", kind: tar.TypeFifo},
	})
	entries, stats := writeTar(t, func(w *layerWriter) error {
		return w.writeTree(context.Background(), root, everything)
	})

	want := []struct {
		name string
		typ  byte
		mode int64
		link string
		body string
	}{
		{"a/", tar.TypeDir, 0o755, "", ""},
		{"a/file", tar.TypeReg, 0o640, "", "hello\n"},
		{"a/hard", tar.TypeLink, 0o640, "a/file", ""},
		{"a/link", tar.TypeSymlink, 0o777, "../z", ""},
		{"a-b", tar.TypeReg, 0o600, "", "dash\n"},
		{"b/", tar.TypeDir, 0o700, "", ""},
		{"b/setuid", tar.TypeReg, 0o4755, "", "#!/bin/sh\n"},
		{"c/", tar.TypeDir, 0o1777, "", ""},
		{"z", tar.TypeReg, 0o644, "", "last\n"},
	}
	if len(entries) != len(want) {
		t.Fatalf("entries %q, want %d of them", names(entries), len(want))
	}
	for i, w := range want {
		t.Run(w.name, func(t *testing.T) {
			h := entries[i].hdr
			if h.Name != w.name || h.Typeflag != w.typ || h.Linkname != w.link || entries[i].body != w.body {
				t.Fatalf("entry %d = %q type %c link %q body %q, want %q type %c link %q body %q",
					i, h.Name, h.Typeflag, h.Linkname, entries[i].body, w.name, w.typ, w.link, w.body)
			}
			if h.Typeflag != tar.TypeSymlink && h.Mode != w.mode {
				t.Errorf("mode %o, want %o", h.Mode, w.mode)
			}
			if h.Uid != os.Getuid() || h.Gid != os.Getgid() {
				t.Errorf("owner %d:%d, want %d:%d", h.Uid, h.Gid, os.Getuid(), os.Getgid())
			}
			if h.Typeflag != tar.TypeSymlink && !h.ModTime.Equal(treeTime) {
				t.Errorf("mtime %s, want %s", h.ModTime, treeTime)
			}
		})
	}
	if stats.Hardlinks != 1 || stats.Entries != len(want) {
		t.Errorf("stats: %d hardlinks, %d entries; want 1, %d", stats.Hardlinks, stats.Entries, len(want))
	}
	if !slices.Equal(stats.Skipped, []string{"fifo"}) || !slices.Equal(stats.Setid, []string{"b/setuid"}) {
		t.Errorf("stats: skipped %q, setid %q; want [fifo], [b/setuid]", stats.Skipped, stats.Setid)
	}
}

func TestWriteTreeOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	root := makeTree(t, []node{{path: "f", kind: tar.TypeReg, mode: 0o4755, body: "x"}})
	if err := os.Lchown(filepath.Join(root, "f"), 1234, 5678); err != nil {
		t.Fatal(err)
	}
	// chown clears setuid: set it again.
	if err := os.Chmod(filepath.Join(root, "f"), fs.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	entries, _ := writeTar(t, func(w *layerWriter) error {
		return w.writeTree(context.Background(), root, everything)
	})
	if h := entries[0].hdr; h.Uid != 1234 || h.Gid != 5678 || h.Mode != 0o4755 || h.Uname != "" {
		t.Errorf("f: owner %d:%d (%q) mode %o, want 1234:5678 numeric mode 4755", h.Uid, h.Gid, h.Uname, h.Mode)
	}
}

func TestWriteTreeCanceled(t *testing.T) {
	root := makeTree(t, []node{{path: "f", kind: tar.TypeReg, mode: 0o644}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := newLayerWriter(io.Discard)
	if err := w.writeTree(ctx, root, everything); !errors.Is(err, context.Canceled) {
		t.Fatalf("writeTree with a canceled context: %v, want context.Canceled", err)
	}
}

func TestSelections(t *testing.T) {
	tests := []struct {
		rel                      string
		baseEmit, baseDescend    bool
		pythonEmit, pythonDescnd bool
	}{
		{"etc", true, true, false, false},
		{"usr", true, true, true, true},
		{"usr/lib", true, true, true, true},
		{"usr/bin", true, true, false, false},
		{"usr/lib/python3", false, false, true, true},
		{"usr/lib/python3.11", false, false, true, true},
		{"usr/lib/python3.11/os.py", false, false, true, true},
		{"usr/lib/python2.7", true, true, false, false},
		{"usr/lib/x86_64-linux-gnu", true, true, false, false},
		{"usr/share", false, false, true, true},
		{"usr/share/doc/README", false, false, true, true},
		{"usr/sharedfoo", true, true, false, false},
		{"usr/local/lib/python3.11", true, true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.rel, func(t *testing.T) {
			if e, d := baseSelection(tt.rel); e != tt.baseEmit || d != tt.baseDescend {
				t.Errorf("baseSelection = %v, %v; want %v, %v", e, d, tt.baseEmit, tt.baseDescend)
			}
			if e, d := pythonSelection(tt.rel); e != tt.pythonEmit || d != tt.pythonDescnd {
				t.Errorf("pythonSelection = %v, %v; want %v, %v", e, d, tt.pythonEmit, tt.pythonDescnd)
			}
		})
	}
}

// fakeRootfs is a tiny stand-in for the debootstrap tree.
func fakeRootfs(t *testing.T) string {
	return makeTree(t, []node{
		{path: "etc", kind: tar.TypeDir, mode: 0o755},
		{path: "etc/hostname", kind: tar.TypeReg, mode: 0o644, body: "box\n"},
		{path: "opt", kind: tar.TypeDir, mode: 0o755},
		{path: "usr", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/bin", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/bin/python3.11", kind: tar.TypeReg, mode: 0o755, body: "ELF\n"},
		{path: "usr/bin/python3", kind: tar.TypeSymlink, body: "python3.11"},
		{path: "usr/lib", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/lib/python3", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/lib/python3/dist-packages", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/lib/python3.11", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/lib/python3.11/os.py", kind: tar.TypeReg, mode: 0o644, body: "import sys\n"},
		{path: "usr/lib/x86_64-linux-gnu", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/lib/x86_64-linux-gnu/libc.so.6", kind: tar.TypeReg, mode: 0o755, body: "libc\n"},
		{path: "usr/share", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/share/doc", kind: tar.TypeDir, mode: 0o755},
		{path: "usr/share/doc/README", kind: tar.TypeReg, mode: 0o644, body: "read me\n"},
	})
}

func TestAMD64Layers(t *testing.T) {
	root := fakeRootfs(t)
	noOpt := fakeRootfs(t)
	if err := os.Remove(filepath.Join(noOpt, "opt")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		root  string
		layer int
		want  []string
	}{
		{"base", root, 0, []string{
			"etc/", "etc/hostname", "opt/", "usr/", "usr/bin/", "usr/bin/python3", "usr/bin/python3.11",
			"usr/lib/", "usr/lib/x86_64-linux-gnu/", "usr/lib/x86_64-linux-gnu/libc.so.6",
			"etc/flmbox-test/", RemovedFile,
			"opt/flmbox-test/", OpaqueDir + "/", OpaqueOld, OpaqueDir + "/sub/", OpaqueDeep,
		}},
		{"base without opt", noOpt, 0, []string{
			"etc/", "etc/hostname", "usr/", "usr/bin/", "usr/bin/python3", "usr/bin/python3.11",
			"usr/lib/", "usr/lib/x86_64-linux-gnu/", "usr/lib/x86_64-linux-gnu/libc.so.6",
			"etc/flmbox-test/", RemovedFile,
			"opt/", "opt/flmbox-test/", OpaqueDir + "/", OpaqueOld, OpaqueDir + "/sub/", OpaqueDeep,
		}},
		{"python", root, 1, []string{
			"usr/", "usr/lib/", "usr/lib/python3/", "usr/lib/python3/dist-packages/",
			"usr/lib/python3.11/", "usr/lib/python3.11/os.py",
			"usr/share/", "usr/share/doc/", "usr/share/doc/README",
		}},
		{"top", root, 2, []string{
			"etc/", "etc/flmbox-test/", "etc/flmbox-test/.wh.removed.txt",
			"opt/", "opt/flmbox-test/", HardlinkFirst, HardlinkSecond,
			OpaqueDir + "/", OpaqueDir + "/.wh..wh..opq", OpaqueNew,
			SetuidFile, StickyDir + "/", Symlink,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := amd64Layers(tt.root)[tt.layer]
			entries, _ := writeTar(t, func(w *layerWriter) error { return spec.fill(context.Background(), w) })
			if got := names(entries); !slices.Equal(got, tt.want) {
				t.Fatalf("entries\n%q\nwant\n%q", got, tt.want)
			}
		})
	}

	t.Run("top details", func(t *testing.T) {
		entries, _ := writeTar(t, func(w *layerWriter) error { return amd64Layers(root)[2].fill(context.Background(), w) })
		byName := map[string]tarEntry{}
		for _, e := range entries {
			byName[e.hdr.Name] = e
		}
		checks := []struct {
			name string
			typ  byte
			mode int64
			link string
			body string
		}{
			{OpaqueNew, tar.TypeReg, 0o644, "", OpaqueNewContent},
			{HardlinkFirst, tar.TypeReg, 0o644, "", HardlinkContent},
			{HardlinkSecond, tar.TypeLink, 0o644, HardlinkFirst, ""},
			{SetuidFile, tar.TypeReg, 0o4755, "", "#!/bin/sh\nid -u\n"},
			{StickyDir + "/", tar.TypeDir, 0o1777, "", ""},
			{Symlink, tar.TypeSymlink, 0o777, SymlinkTarget, ""},
		}
		for _, c := range checks {
			e, ok := byName[c.name]
			if !ok {
				t.Errorf("%s missing", c.name)
				continue
			}
			if e.hdr.Typeflag != c.typ || e.hdr.Mode != c.mode || e.hdr.Linkname != c.link || e.body != c.body ||
				e.hdr.Uid != 0 || e.hdr.Gid != 0 || !e.hdr.ModTime.Equal(FixtureTime) {
				t.Errorf("%s: type %c mode %o link %q body %q owner %d:%d mtime %s; want type %c mode %o link %q body %q, 0:0, %s",
					c.name, e.hdr.Typeflag, e.hdr.Mode, e.hdr.Linkname, e.body, e.hdr.Uid, e.hdr.Gid, e.hdr.ModTime,
					c.typ, c.mode, c.link, c.body, FixtureTime)
			}
		}
		// The tree's own metadata for the parents.
		if e := byName["etc/"]; !e.hdr.ModTime.Equal(treeTime) {
			t.Errorf("etc/: mtime %s, want the tree's %s", e.hdr.ModTime, treeTime)
		}
	})
}
