package rootfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// maxZstdWindow bounds the memory a zstd layer may make the decoder allocate
// (klauspost's default is 512 MiB): 128 MiB admits `zstd --long=27`.
const maxZstdWindow = 128 << 20

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// decompress returns the uncompressed stream of a layer blob. The format is
// sniffed from magic bytes, as go-containerregistry does, so layers labelled
// gzip but stored uncompressed (seen in the wild) still unpack; integrity
// rests on the digests, not on the media type.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	magic, err := br.Peek(4)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read layer: %w", err)
	}
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("decompress gzip layer: %w", err)
		}
		return &decompressor{r: gz, close: gz.Close, format: "gzip"}, nil
	case bytes.HasPrefix(magic, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, fmt.Errorf("decompress zstd layer: %w", err)
		}
		return &decompressor{r: zr, close: func() error { zr.Close(); return nil }, format: "zstd"}, nil
	}
	return io.NopCloser(br), nil
}

// decompressor names the format in its errors: "decompress gzip layer:
// unexpected EOF" says more than "unexpected EOF".
type decompressor struct {
	r      io.Reader
	close  func() error
	format string
}

func (d *decompressor) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		err = fmt.Errorf("decompress %s layer: %w", d.format, err)
	}
	return n, err
}

func (d *decompressor) Close() error { return d.close() }
