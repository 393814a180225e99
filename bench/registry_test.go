package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/flmbox/flmbox/rootfs"
)

// testImage is a random image for linux/arch.
func testImage(t *testing.T, arch string) v1.Image {
	t.Helper()
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestRegistryPush copies a two-platform image from an OCI layout whose
// index.json wraps the index (as the test image's does) into the loopback
// registry: every manifest, but the blobs of the chosen platform only.
func TestRegistryPush(t *testing.T) {
	amd, arm := testImage(t, "amd64"), testImage(t, "arm64")
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	idxDigest, _ := idx.Digest()
	amdDigest, _ := amd.Digest()
	armDigest, _ := arm.Digest()

	reg, err := startRegistry()
	if err != nil {
		t.Fatal(err)
	}
	defer reg.close()
	image := "oci-layout:" + dir + "@" + idxDigest.String()
	if err := reg.push(t.Context(), image, idxDigest.String(), amdDigest.String()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []v1.Hash{idxDigest, amdDigest, armDigest} {
		if _, err := remote.Head(reg.repo.Digest(d.String())); err != nil {
			t.Errorf("manifest %s: %v", d, err)
		}
	}
	blobs := func(img v1.Image) []v1.Hash {
		m, _ := img.Manifest()
		out := []v1.Hash{m.Config.Digest}
		for _, l := range m.Layers {
			out = append(out, l.Digest)
		}
		return out
	}
	for _, d := range blobs(amd) {
		l, err := remote.Layer(reg.repo.Digest(d.String()))
		if err == nil {
			_, err = l.Size()
		}
		if err != nil {
			t.Errorf("amd64 blob %s: %v", d, err)
		}
	}
	for _, d := range blobs(arm) {
		if l, err := remote.Layer(reg.repo.Digest(d.String())); err == nil {
			if _, err := l.Size(); err == nil {
				t.Errorf("arm64 blob %s was copied", d)
			}
		}
	}
	// flmbox prewarms it from there.
	store, err := rootfs.OpenStore(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Prewarm(t.Context(), reg.ref(idxDigest.String()), &rootfs.PullOptions{Platform: rootfs.Platform{OS: "linux", Architecture: "amd64"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ManifestDigest != amdDigest.String() || res.IndexDigest != idxDigest.String() {
		t.Fatalf("prewarmed %+v", res)
	}

	// Other ways of naming what is in the layout.
	for _, d := range []v1.Hash{amdDigest, idxDigest} {
		if _, err := sourceObject(t.Context(), "oci-layout:"+dir, d.String()); err != nil {
			t.Errorf("find %s: %v", d, err)
		}
	}
	root, _ := p.ImageIndex()
	rootDigest, _ := root.Digest()
	if _, err := sourceObject(t.Context(), "oci-layout:"+dir, rootDigest.String()); err != nil {
		t.Errorf("find index.json itself: %v", err)
	}
	missing := "sha256:" + strings.Repeat("0", 64)
	if _, err := sourceObject(t.Context(), "oci-layout:"+dir, missing); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a missing digest: %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}
