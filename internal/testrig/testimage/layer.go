package testimage

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// layerSpec describes one layer to write.
type layerSpec struct {
	// name is used in logs and in the history of the image config.
	name string
	// zstd selects zstd compression and the tar+zstd media type; gzip
	// otherwise.
	zstd bool
	// fill writes the layer's entries.
	fill func(ctx context.Context, w *layerWriter) error
}

// builtLayer is a layer written to a file in the work directory.
type builtLayer struct {
	spec         layerSpec
	layer        v1.Layer
	mediaType    types.MediaType
	size         int64 // compressed bytes
	uncompressed int64 // tar bytes
	stats        layerStats
}

// countingHash hashes and counts what is written to it.
type countingHash struct {
	h hash.Hash
	n int64
}

func newCountingHash() *countingHash { return &countingHash{h: sha256.New()} }

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

func (c *countingHash) digest() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(c.h.Sum(nil))}
}

// writeLayer writes spec's tar stream, compressed, to a new file in dir and
// returns it as a ggcr layer. The digest and diff_id computed while writing
// are checked against the ones ggcr computes from the file.
func writeLayer(ctx context.Context, dir string, spec layerSpec) (_ *builtLayer, err error) {
	mt, comp, ext := types.OCILayer, compression.GZip, ".tar.gz"
	if spec.zstd {
		mt, comp, ext = types.OCILayerZStd, compression.ZStd, ".tar.zst"
	}
	f, err := os.CreateTemp(dir, "layer-*"+ext)
	if err != nil {
		return nil, fmt.Errorf("create layer file: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close() // may already be closed
			os.Remove(f.Name())
		}
	}()

	compressed, uncompressed := newCountingHash(), newCountingHash()
	bw := bufio.NewWriterSize(io.MultiWriter(f, compressed), 1<<20)
	var cw io.WriteCloser
	if spec.zstd {
		// One encoder goroutine: the output does not depend on the machine.
		cw, err = zstd.NewWriter(bw, zstd.WithEncoderConcurrency(1))
	} else {
		cw, err = gzip.NewWriterLevel(bw, gzip.DefaultCompression)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s compressor: %w", comp, err)
	}
	lw := newLayerWriter(io.MultiWriter(cw, uncompressed))
	if err := spec.fill(ctx, lw); err != nil {
		return nil, fmt.Errorf("write layer %s: %w", spec.name, err)
	}
	if err := lw.close(); err != nil {
		return nil, fmt.Errorf("write layer %s: %w", spec.name, err)
	}
	if err := cw.Close(); err != nil {
		return nil, fmt.Errorf("compress layer %s: %w", spec.name, err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("write layer %s: %w", spec.name, err)
	}
	name := f.Name()
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("write layer %s: %w", spec.name, err)
	}

	layer, err := tarball.LayerFromFile(name, tarball.WithMediaType(mt), tarball.WithCompression(comp))
	if err != nil {
		return nil, fmt.Errorf("read back layer %s: %w", spec.name, err)
	}
	if err := checkHash(spec.name, "digest", layer.Digest, compressed.digest()); err != nil {
		return nil, err
	}
	if err := checkHash(spec.name, "diff_id", layer.DiffID, uncompressed.digest()); err != nil {
		return nil, err
	}
	return &builtLayer{
		spec:         spec,
		layer:        layer,
		mediaType:    mt,
		size:         compressed.n,
		uncompressed: uncompressed.n,
		stats:        lw.stats,
	}, nil
}

// checkHash compares a digest ggcr computed with the one computed while
// writing; a difference means the file changed under us.
func checkHash(layer, kind string, got func() (v1.Hash, error), want v1.Hash) error {
	h, err := got()
	if err != nil {
		return fmt.Errorf("compute %s of layer %s: %w", kind, layer, err)
	}
	if h != want {
		return fmt.Errorf("verify layer %s: %s %s read back, %s written; is something else writing to the cache directory? %w",
			layer, kind, h, want, errdefs.ErrDataLoss)
	}
	return nil
}
