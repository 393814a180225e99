//go:build integration

package integration

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/rootfs"
)

// pushDerived pushes the test image's linux/amd64 image with one more
// layer holding files (path → content, mode 0644) to reg as repo:tag, and
// returns its reference by digest and the new layer's diff_id.
func pushDerived(t *testing.T, reg *testRegistry, tag string, files map[string][]byte) (string, v1.Hash) {
	t.Helper()
	var entries []layerEntry
	for _, p := range slices.Sorted(maps.Keys(files)) {
		entries = append(entries, layerEntry{hdr: tar.Header{Name: p, Mode: 0o644}, body: files[p]})
	}
	return pushImage(t, reg, tag, entries, nil)
}

// layerEntry is an entry of a layer pushImage makes: its header (Size,
// Typeflag and ModTime filled in if zero) and a regular file's content.
type layerEntry struct {
	hdr  tar.Header
	body []byte
}

// pushImage pushes the test image's linux/amd64 image with one more layer
// of entries, its config changed by config (if not nil), to reg as
// repo-derived:tag, and returns its reference by digest and the new
// layer's diff_id.
func pushImage(t *testing.T, reg *testRegistry, tag string, entries []layerEntry, config func(*v1.Config)) (string, v1.Hash) {
	t.Helper()
	base, err := img.Index.Image(img.AMD64Digest)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if hdr.ModTime.IsZero() {
			hdr.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	derived, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	if config != nil {
		cf, err := derived.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cfg := cf.Config.DeepCopy()
		config(cfg)
		if derived, err = mutate.Config(derived, *cfg); err != nil {
			t.Fatal(err)
		}
	}
	ref, err := name.ParseReference(reg.host + "/" + repo + "-derived:" + tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, derived); err != nil {
		t.Fatal(err)
	}
	d, _ := derived.Digest()
	diffID, _ := layer.DiffID()
	return reg.host + "/" + repo + "-derived@" + d.String(), diffID
}

// TestImagesShareTheirBase prewarms the test image and two images made
// from it with a layer each: the base's layers are fetched and stored once,
// the derived images' trees share their files (hard links), `images ls`
// tells each image's shared and unique bytes, a sandbox runs on a derived
// image, and removing an image frees only what no other image has.
func TestImagesShareTheirBase(t *testing.T) {
	t.Parallel()
	reg := ownRegistry(t)
	refA, diffA := pushDerived(t, reg, "a", map[string][]byte{"app/a.txt": []byte("image a\n")})
	refB, _ := pushDerived(t, reg, "b", map[string][]byte{"app/b.txt": []byte(strings.Repeat("b", 1<<20))})
	root := t.TempDir()

	start := time.Now()
	base := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())
	baseTook := time.Since(start)
	gets := reg.blobGets.Load()
	start = time.Now()
	a := prewarmJSON(t, root, "--platform", "linux/amd64", refA)
	aTook := time.Since(start)
	// The derived image's config and its own layer: nothing of the base.
	if got := reg.blobGets.Load() - gets; got != 2 || a.Cached {
		t.Errorf("a derived image on a cached base fetched %d blobs (cached %v), want its config and its own layer", got, a.Cached)
	}
	t.Logf("prewarm: the base took %s, an image of one more layer on it %s", baseTook.Round(time.Millisecond), aTook.Round(time.Millisecond))
	b := prewarmJSON(t, root, "--platform", "linux/amd64", refB)

	// The trees share the base's files, and each has its own.
	for _, tree := range []string{a.Rootfs, b.Rootfs} {
		if !sameInode(t, filepath.Join(base.Rootfs, "usr/bin/python3.11"), filepath.Join(tree, "usr/bin/python3.11")) {
			t.Errorf("%s's python3 is not the base's file", tree)
		}
	}
	if got, err := os.ReadFile(filepath.Join(a.Rootfs, "app/a.txt")); err != nil || string(got) != "image a\n" {
		t.Errorf("image a's own file: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(b.Rootfs, "app/a.txt")); !os.IsNotExist(err) {
		t.Errorf("image b has image a's file: %v", err)
	}

	// images ls: shared and unique bytes.
	imgs := map[string]rootfs.Image{}
	for _, i := range mustLs(t, root) {
		imgs[i.ManifestDigest] = i
	}
	ia, ib, ibase := imgs[a.ManifestDigest], imgs[b.ManifestDigest], imgs[base.ManifestDigest]
	baseLayers := len(ibase.DiffIDs)
	if layers, _ := filepath.Glob(filepath.Join(root, "images", "layers", "*")); baseLayers == 0 || len(layers) != baseLayers+2 {
		t.Errorf("%d stored layers, want the base's %d and one of each derived image", len(layers), baseLayers)
	}
	if ia.UniqueBytes != int64(len("image a\n")) || ib.UniqueBytes != 1<<20 || ibase.UniqueBytes != 0 {
		t.Errorf("unique bytes: a %d, b %d, base %d; want 8, 1 MiB and 0", ia.UniqueBytes, ib.UniqueBytes, ibase.UniqueBytes)
	}
	if ia.SharedBytes != ibase.SharedBytes || ibase.SharedBytes < 100<<20 {
		t.Errorf("shared bytes: a %d, base %d; want the base's content in both", ia.SharedBytes, ibase.SharedBytes)
	}
	if out := mustFlmbox(t, root, "images", "ls"); !strings.Contains(out, "SHARED") || !strings.Contains(out, "UNIQUE") || !strings.Contains(out, refA) {
		t.Errorf("images ls shows no shared and unique sizes, or not the reference image a was prewarmed by (%s):\n%s", refA, out)
	}
	if !slices.Contains(ia.Names, refA) {
		t.Errorf("image a's names %q lack the reference it was prewarmed by, %s", ia.Names, refA)
	}

	// A sandbox runs on a derived image's tree.
	if res := flmbox(t, root, "run", "--image", refA, "--language", "shell", "-c", "cat /app/a.txt; python3 -c 'print(6*7)'"); res.code != 0 || res.stdout != "image a\n42\n" {
		t.Fatalf("a snippet on image a: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
	}

	// Removing a frees its own layer alone; the others still run.
	if out := mustFlmbox(t, root, "images", "rm", a.ManifestDigest); out != "Deleted: "+a.ManifestDigest+" (8B)\n" {
		t.Fatalf("images rm a printed %q; want its 8 bytes freed", out)
	}
	if _, err := os.Stat(filepath.Join(root, "images", "layers", diffA.Hex)); !os.IsNotExist(err) {
		t.Errorf("image a's layer outlived it: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Rootfs, "usr/bin/python3.11")); err != nil || len(got) == 0 {
		t.Errorf("image b's python3 after image a's removal: %d bytes, %v", len(got), err)
	}
	mustFlmbox(t, root, "images", "rm", base.ManifestDigest)
	if layers, _ := filepath.Glob(filepath.Join(root, "images", "layers", "*")); len(layers) != baseLayers+1 {
		t.Errorf("%d layers after the base's removal, want image b's %d", len(layers), baseLayers+1)
	}
	// By the ID images ls shows.
	id := strings.TrimPrefix(b.ManifestDigest, "sha256:")[:12]
	if out := mustFlmbox(t, root, "images", "ls"); !strings.Contains(out, id) {
		t.Errorf("images ls does not show image b's ID %s:\n%s", id, out)
	}
	mustFlmbox(t, root, "images", "rm", id)
	if res := flmbox(t, root, "images", "rm", id); res.code != 125 || !strings.Contains(res.stderr, "no cached image has the ID "+id) {
		t.Errorf("images rm of an ID no image has: exit %d, %s", res.code, res.stderr)
	}
	if layers, _ := filepath.Glob(filepath.Join(root, "images", "layers", "*")); len(layers) != 0 {
		t.Errorf("layers left when no image is: %v", layers)
	}
}

// mustLs is `images ls --json`.
func mustLs(t *testing.T, root string) []rootfs.Image {
	t.Helper()
	var imgs []rootfs.Image
	if err := json.Unmarshal([]byte(mustFlmbox(t, root, "images", "ls", "--json")), &imgs); err != nil {
		t.Fatal(err)
	}
	return imgs
}

// sameInode reports whether p and q are one file.
func sameInode(t *testing.T, p, q string) bool {
	t.Helper()
	var sp, sq unix.Stat_t
	if err := unix.Stat(p, &sp); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(q, &sq); err != nil {
		t.Fatal(err)
	}
	return sp.Dev == sq.Dev && sp.Ino == sq.Ino
}
