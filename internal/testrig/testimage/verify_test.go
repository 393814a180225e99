package testimage

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/klauspost/compress/zstd"
)

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
