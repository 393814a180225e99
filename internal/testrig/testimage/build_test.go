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
	"testing"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

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
	return packFakeRecipe(t, cacheDir, defaultRecipe())
}

// packFakeRecipe packs fakeRootfs into the cache entry of r in cacheDir.
func packFakeRecipe(t *testing.T, cacheDir string, r recipe) string {
	t.Helper()
	entry := filepath.Join(cacheDir, r.key())
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

	// The cache answers: the log says so, and no debootstrap ran.
	var log bytes.Buffer
	img, err := Build(context.Background(), Options{CacheDir: cacheDir, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if img.LayoutPath != filepath.Join(entry, "layout") || img.RootfsDir != filepath.Join(entry, "rootfs") {
		t.Errorf("paths %s, %s", img.LayoutPath, img.RootfsDir)
	}
	if !strings.Contains(log.String(), "using "+img.LayoutPath) || strings.Contains(log.String(), "debootstrap") {
		t.Errorf("log %q: want the cache used, no build", log.String())
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

func TestRemoveStaleAndPublish(t *testing.T) {
	cacheDir := t.TempDir()
	prefix := ".tmp-0123456789abcdef-"
	stale := filepath.Join(cacheDir, prefix+"42")
	other := filepath.Join(cacheDir, ".tmp-fedcba9876543210-1")
	for _, d := range []string{filepath.Join(stale, "rootfs/etc"), other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var log bytes.Buffer
	if err := removeStale(cacheDir, prefix, logger{&log}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale build directory: %v, want it removed", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another key's build directory: %v, want it kept", err)
	}
	if !strings.Contains(log.String(), "interrupted build") {
		t.Errorf("log %q does not mention the removal", log.String())
	}

	tmp, err := os.MkdirTemp(cacheDir, prefix)
	if err != nil {
		t.Fatal(err)
	}
	final := filepath.Join(cacheDir, "0123456789abcdef")
	if err := publish(tmp, final); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(final)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("published entry has mode %v, want 0755", fi.Mode())
	}
}
