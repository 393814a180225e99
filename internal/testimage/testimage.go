package testimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
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
	r := defaultRecipe()
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
		return nil, fmt.Errorf("build test image in %s: debootstrap needs root; run 'go run ./internal/cmd/testimage' as root once: %w",
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

// build makes the cache entry final for r in a temporary directory of
// cacheDir and renames it into place. The caller holds the lock.
func build(ctx context.Context, r recipe, cacheDir, final string, log logger) (err error) {
	prefix := ".tmp-" + filepath.Base(final) + "-"
	if err := removeStale(cacheDir, prefix, log); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(cacheDir, prefix)
	if err != nil {
		return fmt.Errorf("create build directory: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()

	rootfs := filepath.Join(tmp, "rootfs")
	log.printf("debootstrap %s %s with %s from %s into %s (about a minute)",
		r.Variant, r.Suite, strings.Join(r.Packages, ","), r.Mirror, rootfs)
	t := time.Now()
	if err := runDebootstrap(ctx, r, rootfs); err != nil {
		return err
	}
	log.printf("debootstrap done in %s", time.Since(t).Round(time.Second))
	cs, err := cleanTree(rootfs)
	if err != nil {
		return err
	}
	log.printf("cleaned tree: removed %d entries, %d of them or below them device nodes, sockets or fifos", cs.Removed, len(cs.Special))

	work := filepath.Join(tmp, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		return fmt.Errorf("create work directory: %w", err)
	}
	t = time.Now()
	if _, err := pack(ctx, rootfs, work, filepath.Join(tmp, "layout"), log); err != nil {
		return err
	}
	log.printf("packed in %s", time.Since(t).Round(time.Millisecond))
	if err := os.RemoveAll(work); err != nil {
		return fmt.Errorf("remove work directory: %w", err)
	}
	return publish(tmp, final)
}

// publish makes the complete build directory tmp readable by all, flushes
// it to the disk and renames it to final.
func publish(tmp, final string) error {
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("publish test image: %w", err)
	}
	fd, err := unix.Open(tmp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("publish test image: %w", &os.PathError{Op: "open", Path: tmp, Err: err})
	}
	err = unix.Syncfs(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("publish test image: sync: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("publish test image: %w", err)
	}
	return nil
}

// removeStale removes build directories left by crashed builds. The caller
// holds the lock, so none of them is in use.
func removeStale(cacheDir, prefix string, log logger) error {
	stale, err := filepath.Glob(filepath.Join(cacheDir, prefix+"*"))
	if err != nil {
		return fmt.Errorf("find stale build directories: %w", err)
	}
	for _, s := range stale {
		log.printf("removing %s, left by an interrupted build", s)
		if err := removeTree(s); err != nil {
			return err
		}
	}
	return nil
}

// errNotBuilt reports a cache entry that does not exist yet.
var errNotBuilt = errors.New("test image not built")

// openImage reads the cache entry dir. The error matches errNotBuilt when
// there is no entry.
func openImage(dir string) (*Image, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read test image %s: %w", dir, errNotBuilt)
	} else if err != nil {
		return nil, fmt.Errorf("read test image: %w", err)
	}
	img := &Image{LayoutPath: filepath.Join(dir, "layout"), RootfsDir: filepath.Join(dir, "rootfs")}
	broken := func(err error) (*Image, error) {
		return nil, fmt.Errorf("read test image %s: %w; remove %s to rebuild it: %w", img.LayoutPath, err, dir, errdefs.ErrDataLoss)
	}
	p, err := layout.FromPath(img.LayoutPath)
	if err != nil {
		return broken(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return broken(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return broken(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex {
		return broken(fmt.Errorf("index.json has %d descriptors, want one image index", len(tm.Manifests)))
	}
	img.IndexDigest = tm.Manifests[0].Digest
	if img.Index, err = top.ImageIndex(img.IndexDigest); err != nil {
		return broken(err)
	}
	im, err := img.Index.IndexManifest()
	if err != nil {
		return broken(err)
	}
	for _, d := range im.Manifests {
		switch {
		case d.Platform == nil || d.Platform.OS != "linux":
		case d.Platform.Architecture == "amd64":
			img.AMD64Digest = d.Digest
		case d.Platform.Architecture == "arm64":
			img.ARM64Digest = d.Digest
		}
	}
	if len(im.Manifests) != 2 || img.AMD64Digest == (v1.Hash{}) || img.ARM64Digest == (v1.Hash{}) {
		return broken(errors.New("image index does not hold exactly linux/amd64 and linux/arm64"))
	}
	return img, nil
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
