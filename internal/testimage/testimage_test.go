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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
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
			if strings.HasPrefix(h.Name, "/") {
				t.Errorf("absolute name %q", h.Name)
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

func TestWriteLayer(t *testing.T) {
	for _, zstd := range []bool{false, true} {
		want := types.OCILayer
		if zstd {
			want = types.OCILayerZStd
		}
		t.Run(string(want), func(t *testing.T) {
			spec := placeholderLayer()
			spec.zstd = zstd
			dir := t.TempDir()
			b, err := writeLayer(context.Background(), dir, spec)
			if err != nil {
				t.Fatal(err)
			}
			if mt, err := b.layer.MediaType(); err != nil || mt != want || b.mediaType != want {
				t.Errorf("media type %s (%v), recorded %s; want %s", mt, err, b.mediaType, want)
			}
			if size, err := b.layer.Size(); err != nil || size != b.size {
				t.Errorf("size %d (%v), recorded %d", size, err, b.size)
			}
			d, _ := b.layer.Digest()
			diffID, _ := b.layer.DiffID()
			verifyLayer(t, b.layer, v1.Descriptor{MediaType: want, Size: b.size, Digest: d}, diffID)
			rc, err := b.layer.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			entries := readTar(t, rc)
			if len(entries) != 1 || entries[0].hdr.Name != PlaceholderFile || entries[0].body != PlaceholderContent {
				t.Errorf("entries %q, want only %s", names(entries), PlaceholderFile)
			}
		})
	}
}

func TestWriteLayerCanceled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	spec := amd64Layers(fakeRootfs(t))[0]
	if _, err := writeLayer(ctx, dir, spec); !errors.Is(err, context.Canceled) {
		t.Fatalf("writeLayer: %v, want context.Canceled", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left %d files behind", len(left))
	}
}

// packFake packs fakeRootfs into the cache entry of the default recipe in
// cacheDir, as a build would.
func packFake(t *testing.T, cacheDir string) string {
	t.Helper()
	entry := filepath.Join(cacheDir, defaultRecipe().key())
	rootfs := filepath.Join(entry, "rootfs")
	if err := os.MkdirAll(entry, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fakeRootfs(t), rootfs); err != nil {
		t.Fatal(err)
	}
	if _, err := pack(context.Background(), rootfs, t.TempDir(), filepath.Join(entry, "layout"), logger{}); err != nil {
		t.Fatal(err)
	}
	return entry
}

func TestPackAndBuildFromCache(t *testing.T) {
	cacheDir := t.TempDir()
	entry := packFake(t, cacheDir)

	var log bytes.Buffer
	start := time.Now()
	img, err := Build(context.Background(), Options{CacheDir: cacheDir, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cached Build took %s", d)
	}
	if img.LayoutPath != filepath.Join(entry, "layout") || img.RootfsDir != filepath.Join(entry, "rootfs") {
		t.Errorf("paths %s, %s", img.LayoutPath, img.RootfsDir)
	}
	if !strings.Contains(log.String(), "using "+img.LayoutPath) {
		t.Errorf("log %q does not mention the cache", log.String())
	}
	verifyIndex(t, img.Index)
	if d, _ := img.Index.Digest(); d != img.IndexDigest {
		t.Errorf("index digest %s, Image says %s", d, img.IndexDigest)
	}

	tests := []struct {
		digest      v1.Hash
		arch        string
		layerTypes  []types.MediaType
		cmd         []string
		topEntries  int
		topSetuided string
	}{
		{img.AMD64Digest, "amd64", []types.MediaType{types.OCILayer, types.OCILayer, types.OCILayerZStd}, imageCmd, 13, SetuidFile},
		{img.ARM64Digest, "arm64", []types.MediaType{types.OCILayer}, nil, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.arch, func(t *testing.T) {
			im, err := img.Index.Image(tt.digest)
			if err != nil {
				t.Fatal(err)
			}
			m, err := im.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
				t.Errorf("manifest %s, config %s; want OCI types", m.MediaType, m.Config.MediaType)
			}
			var got []types.MediaType
			for _, l := range m.Layers {
				got = append(got, l.MediaType)
			}
			if !slices.Equal(got, tt.layerTypes) {
				t.Errorf("layer media types %v, want %v", got, tt.layerTypes)
			}
			cfg, err := im.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OS != "linux" || cfg.Architecture != tt.arch || !slices.Equal(cfg.Config.Cmd, tt.cmd) ||
				len(cfg.RootFS.DiffIDs) != len(tt.layerTypes) {
				t.Errorf("config %s/%s cmd %q with %d diff_ids", cfg.OS, cfg.Architecture, cfg.Config.Cmd, len(cfg.RootFS.DiffIDs))
			}
		})
	}
}

func TestOpenImageErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := openImage(filepath.Join(dir, "missing")); !errors.Is(err, errNotBuilt) {
		t.Errorf("missing entry: %v, want errNotBuilt", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "broken", "layout"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := openImage(filepath.Join(dir, "broken"))
	if !errdefs.IsDataLoss(err) || errors.Is(err, errNotBuilt) || !strings.Contains(err.Error(), "to rebuild it") {
		t.Errorf("broken entry: %v, want a data loss error that says what to do", err)
	}
}

func TestCleanTree(t *testing.T) {
	root := makeTree(t, []node{
		{path: "dev/fifo", kind: tar.TypeFifo},
		{path: "dev/pts/x", kind: tar.TypeReg, mode: 0o644},
		{path: "proc/self", kind: tar.TypeSymlink, body: "1"},
		{path: "sys", kind: tar.TypeDir, mode: 0o555},
		{path: "run/lock/x", kind: tar.TypeReg, mode: 0o644},
		{path: "var/cache/apt/archives/python3_3.11.deb", kind: tar.TypeReg, mode: 0o644},
		{path: "var/cache/apt/archives/partial", kind: tar.TypeDir, mode: 0o755},
		{path: "var/lib/apt/lists/deb.debian.org_Packages", kind: tar.TypeReg, mode: 0o644},
		{path: "var/lib/apt/lists/partial", kind: tar.TypeDir, mode: 0o700},
		{path: "etc/keep", kind: tar.TypeReg, mode: 0o644},
	})
	st, err := cleanTree(root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Special, []string{"dev/fifo"}) || st.Removed != 7 {
		t.Errorf("stats %+v, want 7 removed and dev/fifo special", st)
	}
	for dir, want := range map[string][]string{
		"dev": nil, "proc": nil, "sys": nil, "run": nil,
		"var/cache/apt/archives": {"partial"}, "var/lib/apt/lists": nil, "etc": {"keep"},
	} {
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s holds %q, want %q", dir, got, want)
		}
	}
}

func TestMirror(t *testing.T) {
	tests := []struct {
		name, file, content, want string
	}{
		{"one-line", "sources.list", "# comment\ndeb-src http://src/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://m.example/debian/ bookworm main\n", "http://m.example/debian"},
		{"one-line other suite", "sources.list", "deb http://security/debian-security bookworm-security main\n", defaultMirror},
		{"one-line cdrom", "sources.list", "deb cdrom:[Debian]/ bookworm main\n", defaultMirror},
		{"deb822", "sources.list.d/debian.sources", `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: https://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
`, "https://mirror.example/debian"},
		{"deb822 disabled", "sources.list.d/debian.sources", "Types: deb\nURIs: http://off/debian\nSuites: bookworm\nEnabled: no\n", defaultMirror},
		{"deb822 inline key", "sources.list.d/x.sources", "Types: deb\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n URIs: http://bad/\nURIs: http://good/debian\nSuites: bookworm\n", "http://good/debian"},
		{"ignored file", "sources.list.d/x.list.disabled", "deb http://off/debian bookworm main\n", defaultMirror},
		{"none", "", "", defaultMirror},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.file != "" {
				p := filepath.Join(dir, tt.file)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(tt.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := aptMirror(dir, "bookworm"); got != tt.want {
				t.Errorf("aptMirror = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRecipeKey(t *testing.T) {
	r := defaultRecipe()
	key := r.key()
	if len(key) != 16 || strings.Trim(key, "0123456789abcdef") != "" {
		t.Fatalf("key %q is not 16 hex digits", key)
	}
	if defaultRecipe().key() != key {
		t.Error("key is not stable")
	}
	changes := map[string]func(*recipe){
		"version": func(r *recipe) { r.Version++ },
		"mirror":  func(r *recipe) { r.Mirror = "http://other/debian" },
		"package": func(r *recipe) { r.Packages = append(r.Packages, "curl") },
		"suite":   func(r *recipe) { r.Suite = "trixie" },
		"variant": func(r *recipe) { r.Variant = "buildd" },
	}
	for name, change := range changes {
		c := defaultRecipe()
		change(&c)
		if c.key() == key {
			t.Errorf("changing the %s keeps the key", name)
		}
	}
	args := strings.Join(r.debootstrapArgs("/t"), " ")
	if want := "--variant=minbase --arch=amd64 --include=python3,python3-pip bookworm /t " + r.Mirror; args != want {
		t.Errorf("debootstrap args %q, want %q", args, want)
	}
}

func TestLockFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := lockFile(context.Background(), path, func() { t.Error("first lock waited") })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*lockPoll)
	defer cancel()
	waited := false
	if _, err := lockFile(ctx, path, func() { waited = true }); !errors.Is(err, context.DeadlineExceeded) || !waited {
		t.Errorf("second lock: %v (waited %v), want a deadline error after waiting", err, waited)
	}
	unlock()
	unlock2, err := lockFile(context.Background(), path, func() { t.Error("lock waited after unlock") })
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
}

func TestMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/var/a\040b\134c`); got != `/var/a b\c` {
		t.Errorf("unescape = %q", got)
	}
	mps, err := mountsUnder(t.TempDir())
	if err != nil || len(mps) != 0 {
		t.Errorf("mounts under a new temp dir: %q, %v", mps, err)
	}
	if mps, err := mountsUnder("/"); err != nil || !slices.Contains(mps, "/") {
		t.Errorf("mounts under /: %q, %v; want / among them", mps, err)
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 16}
	io.WriteString(tb, "one\ntwo\nthree\nfour\nfive\n")
	if got := tb.lines(2); got != "four\nfive" {
		t.Errorf("lines(2) = %q", got)
	}
	if got := tb.lines(10); strings.Contains(got, "one") {
		t.Errorf("tail kept %q beyond its limit", got)
	}
}

// layerContent is what a layer's tar stream holds: every header, and the
// content of regular files up to 4 KiB.
type layerContent struct {
	hdrs  []*tar.Header
	small map[string]string
}

func (c layerContent) has(name string) bool {
	return slices.ContainsFunc(c.hdrs, func(h *tar.Header) bool { return h.Name == name })
}

// verifyIndex checks every image of idx and returns the content of each
// image's layers by manifest digest.
func verifyIndex(t *testing.T, idx v1.ImageIndex) map[v1.Hash][]layerContent {
	t.Helper()
	// validate.Index reads layers with compress/gzip only, so it cannot
	// check zstd layers: it checks the structure, verifyImage the bytes.
	if err := validate.Index(idx, validate.Fast); err != nil {
		t.Fatalf("validate index: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[v1.Hash][]layerContent{}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out[d.Digest] = verifyImage(t, img)
	}
	return out
}

// verifyImage checks each layer's size, digest and diff_id against the
// manifest and config, and that it is a valid tar stream.
func verifyImage(t *testing.T, img v1.Image) []layerContent {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != len(m.Layers) || len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		t.Fatalf("%d layers, %d in the manifest, %d diff_ids", len(layers), len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	out := make([]layerContent, len(layers))
	for i, l := range layers {
		out[i] = verifyLayer(t, l, m.Layers[i], cfg.RootFS.DiffIDs[i])
	}
	return out
}

// verifyLayer checks a layer's compressed bytes against desc and its
// uncompressed bytes against diffID, decompressing as desc's media type
// says.
func verifyLayer(t *testing.T, l v1.Layer, desc v1.Descriptor, diffID v1.Hash) layerContent {
	t.Helper()
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	compressed := newCountingHash()
	r := io.TeeReader(rc, compressed)
	var dr io.Reader
	switch desc.MediaType {
	case types.OCILayer:
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		dr = zr
	case types.OCILayerZStd:
		zr, err := zstd.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		dr = zr
	default:
		t.Fatalf("layer media type %s", desc.MediaType)
	}
	uncompressed := newCountingHash()
	tr := tar.NewReader(io.TeeReader(dr, uncompressed))
	c := layerContent{small: map[string]string{}}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("layer %s: %v", desc.Digest, err)
		}
		c.hdrs = append(c.hdrs, hdr)
		b, err := io.ReadAll(io.LimitReader(tr, 4<<10))
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size <= 4<<10 {
			c.small[hdr.Name] = string(b)
		}
	}
	// Drain the padding after the tar trailer, then the compressed stream.
	if _, err := io.Copy(io.Discard, dr); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatal(err)
	}
	if compressed.digest() != desc.Digest || compressed.n != desc.Size {
		t.Errorf("layer %s: content has digest %s, size %d; descriptor says size %d", desc.Digest, compressed.digest(), compressed.n, desc.Size)
	}
	if uncompressed.digest() != diffID {
		t.Errorf("layer %s: diff_id %s, config says %s", desc.Digest, uncompressed.digest(), diffID)
	}
	return c
}
