package testimage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

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
	if err := r.checkTree(rootfs); err != nil {
		return err
	}
	cs, err := cleanTree(rootfs)
	if err != nil {
		return err
	}
	log.printf("cleaned tree: removed %d entries", cs.Removed)
	if len(cs.Special) > 0 {
		log.printf("  device nodes, sockets and fifos among them: %s", strings.Join(cs.Special, " "))
	}

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
