//go:build integration

package testimage

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestBuild builds the real image (debootstrap, about a minute, root) or
// uses this machine's cache, and checks the layout it is kept in.
func TestBuild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var log bytes.Buffer
	img, err := Build(ctx, Options{Log: &log})
	t.Logf("build log:\n%s", log.String())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("index.json", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(img.LayoutPath, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		var top v1.IndexManifest
		if err := json.Unmarshal(b, &top); err != nil {
			t.Fatal(err)
		}
		if len(top.Manifests) != 1 {
			t.Fatalf("index.json has %d descriptors, want 1", len(top.Manifests))
		}
		d := top.Manifests[0]
		if d.MediaType != types.OCIImageIndex || d.Digest != img.IndexDigest || d.Annotations[refNameAnnotation] != RefName {
			t.Errorf("descriptor %s %s %v; want %s %s annotated %s", d.MediaType, d.Digest, d.Annotations, types.OCIImageIndex, img.IndexDigest, RefName)
		}
	})

	im, err := img.Index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range im.Manifests {
		platforms = append(platforms, d.Platform.String())
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("platforms %q, want linux/amd64 and linux/arm64", platforms)
	}

	contents := verifyIndex(t, img.Index)

	t.Run("amd64", func(t *testing.T) {
		amd64, err := img.Index.Image(img.AMD64Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, err := amd64.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		var mts []types.MediaType
		for _, l := range m.Layers {
			mts = append(mts, l.MediaType)
		}
		if len(mts) < 3 || mts[0] != types.OCILayer || mts[1] != types.OCILayer || mts[len(mts)-1] != types.OCILayerZStd {
			t.Errorf("layer media types %v, want gzip, gzip, ..., zstd", mts)
		}
		cfg, err := amd64.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != "linux" || cfg.Architecture != "amd64" || !slices.Equal(cfg.Config.Env, imageEnv) || !slices.Equal(cfg.Config.Cmd, imageCmd) {
			t.Errorf("config %s/%s env %q cmd %q", cfg.OS, cfg.Architecture, cfg.Config.Env, cfg.Config.Cmd)
		}

		layers := contents[img.AMD64Digest]
		base, python, top := layers[0], layers[1], layers[len(layers)-1]
		for _, name := range []string{"usr/bin/python3", "etc/os-release", RemovedFile, OpaqueOld, OpaqueDeep} {
			if !base.has(name) {
				t.Errorf("layer 1 lacks %s", name)
			}
		}
		for _, name := range []string{"usr/", "usr/lib/", "usr/share/", "usr/lib/python3.11/os.py", "usr/lib/python3/dist-packages/pip/__init__.py"} {
			if !python.has(name) {
				t.Errorf("layer 2 lacks %s", name)
			}
		}
		for _, h := range base.hdrs {
			if inPythonLayer(strings.TrimSuffix(h.Name, "/")) {
				t.Errorf("layer 1 holds %s", h.Name)
				break
			}
		}
		for _, h := range slices.Concat(base.hdrs, python.hdrs, top.hdrs) {
			switch h.Typeflag {
			case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
			default:
				t.Errorf("%s has tar type %c", h.Name, h.Typeflag)
			}
			if strings.HasPrefix(h.Name, "/") || strings.HasPrefix(h.Name, "dev/") && h.Name != "dev/" {
				t.Errorf("entry %s", h.Name)
			}
		}
		for _, name := range []string{"etc/flmbox-test/.wh.removed.txt", OpaqueDir + "/.wh..wh..opq", OpaqueNew, SetuidFile, HardlinkSecond, Symlink} {
			if !top.has(name) {
				t.Errorf("layer 3 lacks %s", name)
			}
		}
	})

	t.Run("amd64 flattened", func(t *testing.T) {
		amd64, err := img.Index.Image(img.AMD64Digest)
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]*tar.Header{}
		bodies := map[string]string{}
		rc := mutate.Extract(amd64)
		defer rc.Close()
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			name := path.Clean(h.Name)
			files[name] = h
			if name == OpaqueNew {
				b, _ := io.ReadAll(tr)
				bodies[name] = string(b)
			}
		}
		for _, gone := range []string{RemovedFile, OpaqueOld, OpaqueDeep} {
			if _, ok := files[gone]; ok {
				t.Errorf("%s survives flattening", gone)
			}
		}
		if bodies[OpaqueNew] != OpaqueNewContent {
			t.Errorf("%s = %q, want %q", OpaqueNew, bodies[OpaqueNew], OpaqueNewContent)
		}
		if h := files[SetuidFile]; h == nil || h.Mode != 0o4755 {
			t.Errorf("%s: %+v, want mode 4755", SetuidFile, h)
		}
		if _, err := os.Stat(filepath.Join(img.RootfsDir, "usr/bin/python3")); err != nil {
			t.Errorf("rootfs: %v", err)
		}
	})

	t.Run("arm64", func(t *testing.T) {
		arm64, err := img.Index.Image(img.ARM64Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := arm64.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		m, err := arm64.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != "linux" || cfg.Architecture != "arm64" || len(m.Layers) != 1 || m.Layers[0].Size > 1024 {
			t.Errorf("config %s/%s, layers %+v; want linux/arm64 with one tiny layer", cfg.OS, cfg.Architecture, m.Layers)
		}
		l := contents[img.ARM64Digest][0]
		if len(l.hdrs) != 1 || l.small[PlaceholderFile] != PlaceholderContent {
			t.Errorf("arm64 layer holds %d entries, %s = %q", len(l.hdrs), PlaceholderFile, l.small[PlaceholderFile])
		}
	})

	t.Run("cached", func(t *testing.T) {
		var log bytes.Buffer
		again, err := Build(ctx, Options{Log: &log})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(log.String(), "using "+img.LayoutPath) || strings.Contains(log.String(), "debootstrap") {
			t.Errorf("second Build's log %q: want the cache used, no build", log.String())
		}
		if again.IndexDigest != img.IndexDigest || again.LayoutPath != img.LayoutPath {
			t.Errorf("second Build: %s at %s, first %s at %s", again.IndexDigest, again.LayoutPath, img.IndexDigest, img.LayoutPath)
		}
	})
}

// TestBuildTestsuite builds the conformance variant (or uses this
// machine's cache) and runs one module of CPython's tests with python3 -m
// test in a chroot of its tree, as the sandbox's user, with a /tmp of its
// own: the suite runs from the tree as packed.
func TestBuildTestsuite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var log bytes.Buffer
	img, err := Build(ctx, Options{Testsuite: true, Log: &log})
	t.Logf("build log:\n%s", log.String())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(filepath.Dir(img.LayoutPath)) != testsuiteRecipe().key() {
		t.Errorf("layout %s is not in the variant's cache entry %s", img.LayoutPath, testsuiteRecipe().key())
	}
	def, err := Build(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if def.IndexDigest == img.IndexDigest {
		t.Fatal("the variant is the default image")
	}
	for _, name := range []string{TestsuiteDir + "/regrtest.py", TestsuiteDir + "/test_atexit.py", "usr/bin/python3.11"} {
		if _, err := os.Stat(filepath.Join(img.RootfsDir, name)); err != nil {
			t.Errorf("tree: %v", err)
		}
	}
	if err := checkSameVersion(filepath.Join(img.RootfsDir, "var/lib/dpkg/status"), pythonPackage, testsuitePackage); err != nil {
		t.Error(err)
	}
	contents := verifyIndex(t, img.Index)
	if python := contents[img.AMD64Digest][1]; !python.has(TestsuiteDir+"/test_atexit.py") || !python.has(TestsuiteDir+"/") {
		t.Errorf("layer 2 lacks %s", TestsuiteDir)
	}

	// A mount namespace of its own (private mounts): the tmpfs on the
	// tree's /tmp and /proc vanish with the shell.
	script := `set -e
mount -t tmpfs -o mode=1777 tmpfs "$1/tmp"
mount -t proc proc "$1/proc"
exec chroot --userspec=65534:65534 "$1" env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 python3 -m test test_atexit`
	cmd := exec.CommandContext(ctx, "sh", "-c", script, "sh", img.RootfsDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Tests result: SUCCESS") {
		t.Fatalf("python3 -m test test_atexit in a chroot of %s: %v\n%s", img.RootfsDir, err, out)
	}
}
