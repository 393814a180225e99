package testimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// DefaultCacheDir is the cache directory used when Options.CacheDir is
// empty and the environment variable CacheDirEnv is unset.
const DefaultCacheDir = "/var/cache/flmbox/testimage"

// CacheDirEnv names the environment variable that overrides DefaultCacheDir.
const CacheDirEnv = "FLMBOX_TESTIMAGE_CACHE"

// Options tune Build. The zero value is valid.
type Options struct {
	// CacheDir holds built images. Default: $FLMBOX_TESTIMAGE_CACHE, else
	// DefaultCacheDir.
	CacheDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Testsuite selects the conformance variant: the image with Debian's
	// libpython3.11-testsuite added, CPython's own regression tests (under
	// TestsuiteDir, run with python3 -m test) for the python3.11 it holds,
	// of the same version. It has a cache entry of its own (about 25 MiB
	// more); the default image is not changed by it.
	Testsuite bool
	// DataScience selects the data-science variant: the image with
	// Debian's numpy, pandas, scipy, scikit-learn, matplotlib, OpenBLAS,
	// pytest and hypothesis, the libraries' own tests included (under
	// DistPackagesDir). It has a cache entry of its own (about 400 MiB
	// more), and so has its combination with Testsuite.
	DataScience bool
}

// Image describes a built layout.
type Image struct {
	// LayoutPath is the OCI image layout directory. Its index.json holds one
	// descriptor, the image index, annotated with RefName.
	LayoutPath string
	// IndexDigest is the digest of the two-platform image index.
	IndexDigest v1.Hash
	// AMD64Digest is the manifest digest of the linux/amd64 image.
	AMD64Digest v1.Hash
	// ARM64Digest is the manifest digest of the linux/arm64 placeholder.
	ARM64Digest v1.Hash
	// RootfsDir is the cleaned debootstrap tree the amd64 image was made
	// from, without the fixtures; do not modify it.
	RootfsDir string
	// Index is the image index read from the layout, for pushing to a
	// registry with remote.WriteIndex.
	Index v1.ImageIndex
}

// Build returns the test image of this machine's cache, building it first
// if needed: debootstrap (about a minute, needs root and the Debian mirror),
// then packing. Concurrent calls, from any process, build it once; later
// calls only read the layout and need no root.
func Build(ctx context.Context, opts Options) (*Image, error) {
	start := time.Now()
	log := logger{opts.Log}
	cacheDir := opts.CacheDir
	if cacheDir == "" {
		cacheDir = os.Getenv(CacheDirEnv)
	}
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	r := recipeFor(opts)
	key := r.key()
	final := filepath.Join(cacheDir, key)

	img, err := openImage(final)
	if !errors.Is(err, errNotBuilt) {
		if err == nil {
			log.printf("using %s (%s)", img.LayoutPath, time.Since(start).Round(time.Microsecond))
		}
		return img, err
	}

	if runtime.GOARCH != r.Arch {
		return nil, fmt.Errorf("build test image: debootstrap of %s needs an %s host; copy a cache built on one to %s: %w",
			r.Arch, r.Arch, final, errdefs.ErrNotImplemented)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("build test image in %s: debootstrap needs root; run 'go run ./internal/testrig/cmd/testimage' as root once: %w",
			final, errdefs.ErrPermissionDenied)
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("create cache directory: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, key+".lock"), func() {
		log.printf("waiting for another process building %s", final)
	})
	if err != nil {
		return nil, err
	}
	defer unlock()

	// Another process may have built it while we waited.
	img, err = openImage(final)
	if !errors.Is(err, errNotBuilt) {
		return img, err
	}
	if err := build(ctx, r, cacheDir, final, log); err != nil {
		return nil, err
	}
	img, err = openImage(final)
	if err == nil {
		log.printf("built %s in %s", final, time.Since(start).Round(time.Second))
	}
	return img, err
}

// logger writes progress lines to an optional writer.
type logger struct{ w io.Writer }

func (l logger) printf(format string, args ...any) {
	if l.w != nil {
		fmt.Fprintf(l.w, "testimage: "+format+"\n", args...)
	}
}

// layer logs what a built layer holds.
func (l logger) layer(b *builtLayer) {
	l.printf("layer %q: %s, %.1f MiB (%.1f MiB tar), %d entries, %d hardlinks, %d setuid/setgid, %d special files skipped",
		b.spec.name, b.mediaType, mib(b.size), mib(b.uncompressed), b.stats.Entries, b.stats.Hardlinks, len(b.stats.Setid), len(b.stats.Skipped))
	if len(b.stats.Setid) > 0 {
		l.printf("  setuid/setgid: %s", strings.Join(b.stats.Setid, " "))
	}
	if len(b.stats.Skipped) > 0 {
		l.printf("  skipped: %s", strings.Join(b.stats.Skipped, " "))
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
