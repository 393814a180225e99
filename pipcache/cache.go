package pipcache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// Cache is a wheel cache in a directory:
//
//	wheels/<wheel filename>   what sandboxes see (mounted read-only): a flat
//	                          directory of wheels for pip's --find-links,
//	                          each a hard link to its blob (0755, files 0644)
//	blobs/sha256/<hex>        the wheels' bytes, by content
//	tmp/                      wheels being imported, inboxes being filled
//	lock                      taken by every change of wheels/ and blobs/
//
// Every wheel in wheels/ was validated (Validate) before it was linked
// there, and a link appears or disappears in one step, so readers (List, pip
// in a sandbox) never see a partial wheel and need no lock.
type Cache struct {
	dir    string
	limits Limits
}

// Options configure a Cache. The zero value selects the defaults.
type Options struct {
	// Limits bound the validation of each wheel imported (see Limits).
	Limits Limits
}

// Wheel is a wheel in the cache.
type Wheel struct {
	// Filename is the wheel's file name in WheelsDir.
	Filename string `json:"filename"`
	// Name is the project's normalized name (NormalizeName).
	Name string `json:"name"`
	// Version is the version (as METADATA wrote it when the wheel was
	// validated; from the filename, normalized, when listed).
	Version string `json:"version"`
	// Digest is the sha256 of the wheel file, "sha256:<hex>".
	Digest string `json:"digest"`
	// Size is the wheel's size in bytes.
	Size int64 `json:"size_bytes"`
	// Added is when the wheel's content entered the cache.
	Added time.Time `json:"added"`
	// AlreadyCached is set by Add when the same wheel was already there.
	AlreadyCached bool `json:"already_cached,omitempty"`
}

// Open opens (creating if needed) the wheel cache in dir. o may be nil.
func Open(dir string, o *Options) (*Cache, error) {
	c := &Cache{dir: dir}
	if o != nil {
		c.limits = o.Limits
	}
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{dir, 0o700}, {c.WheelsDir(), 0o755}, {c.blobsDir(), 0o700}, {c.tmpDir(), 0o700}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("create the wheel cache: %w", err)
		}
		// The sandbox's user reads wheels/ through a bind mount: it must be
		// readable by others whatever the umask was.
		if err := os.Chmod(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("create the wheel cache: %w", err)
		}
	}
	return c, nil
}

// WheelsDir is the flat directory of wheels that sandboxes mount read-only
// and that pip finds wheels in.
func (c *Cache) WheelsDir() string { return filepath.Join(c.dir, "wheels") }

func (c *Cache) blobsDir() string             { return filepath.Join(c.dir, "blobs", "sha256") }
func (c *Cache) blobPath(hex string) string   { return filepath.Join(c.blobsDir(), hex) }
func (c *Cache) tmpDir() string               { return filepath.Join(c.dir, "tmp") }
func (c *Cache) wheelPath(name string) string { return filepath.Join(c.WheelsDir(), name) }

// List returns the cached wheels sorted by name, version and filename.
func (c *Cache) List(ctx context.Context) ([]*Wheel, error) {
	ents, err := os.ReadDir(c.WheelsDir())
	if err != nil {
		return nil, fmt.Errorf("list the wheel cache: %w", err)
	}
	digests, err := c.blobInodes(ctx)
	if err != nil {
		return nil, err
	}
	wheels := []*Wheel{}
	for _, e := range ents {
		fn, err := ParseFilename(e.Name())
		if err != nil || !e.Type().IsRegular() {
			continue // not linked by this package
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		version, _ := NormalizeVersion(fn.Version)
		w := &Wheel{Filename: e.Name(), Name: fn.Name(), Version: version, Size: fi.Size(), Added: fi.ModTime().UTC()}
		if hex, ok := digests[inode(fi)]; ok {
			w.Digest = "sha256:" + hex
		}
		wheels = append(wheels, w)
	}
	sort.Slice(wheels, func(i, j int) bool {
		a, b := wheels[i], wheels[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.Version != b.Version {
			return a.Version < b.Version
		}
		return a.Filename < b.Filename
	})
	return wheels, nil
}

// blobInodes maps the inode of each blob to its hex digest.
func (c *Cache) blobInodes(ctx context.Context) (map[uint64]string, error) {
	ents, err := os.ReadDir(c.blobsDir())
	if err != nil {
		return nil, fmt.Errorf("list the wheel cache: %w", err)
	}
	m := map[uint64]string{}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if fi, err := e.Info(); err == nil {
			m[inode(fi)] = e.Name()
		}
	}
	return m, nil
}

func inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

func links(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}

// Selector chooses wheels by project name and, optionally, version:
// NAME or NAME==VERSION, compared as pip compares them (normalized names,
// PEP 440 versions).
type Selector struct {
	Name    string // normalized
	Version string // "" for every version
}

// ParseSelector parses NAME or NAME==VERSION. Its errors match
// errdefs.ErrInvalidArgument.
func ParseSelector(s string) (Selector, error) {
	name, version, pinned := strings.Cut(s, "==")
	name, version = strings.TrimSpace(name), strings.TrimSpace(version)
	if !validDistribution(strings.ReplaceAll(name, "-", "_")) {
		return Selector{}, fmt.Errorf("%q: want NAME or NAME==VERSION, with a project name of letters, digits, '-', '_' and '.': %w", s, errdefs.ErrInvalidArgument)
	}
	sel := Selector{Name: NormalizeName(name)}
	if pinned {
		if _, err := NormalizeVersion(version); err != nil {
			return Selector{}, fmt.Errorf("%q: %w", s, err)
		}
		sel.Version = version
	}
	return sel, nil
}

// Matches says whether w is selected.
func (s Selector) Matches(w *Wheel) bool {
	return w.Name == s.Name && (s.Version == "" || sameVersion(s.Version, w.Version))
}

// Remove removes every cached wheel that one of sels selects, and the
// blobs no wheel links to any more, and returns what it removed (nothing,
// without an error, when nothing matched). Sandboxes that are reading a
// removed wheel finish reading it.
func (c *Cache) Remove(ctx context.Context, sels []Selector) ([]*Wheel, error) {
	unlock, err := c.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	wheels, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	removed := []*Wheel{}
	for _, w := range wheels {
		for _, s := range sels {
			if s.Matches(w) {
				if err := os.Remove(c.wheelPath(w.Filename)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return removed, fmt.Errorf("remove wheel %s: %w", w.Filename, err)
				}
				removed = append(removed, w)
				break
			}
		}
	}
	return removed, c.sweepBlobs()
}

// sweepBlobs removes the blobs that no wheel links to: those of removed
// wheels, and those of an import killed between publishing a blob and
// linking it. Called under the lock.
func (c *Cache) sweepBlobs() error {
	ents, err := os.ReadDir(c.blobsDir())
	if err != nil {
		return fmt.Errorf("clean the wheel cache: %w", err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err == nil && links(fi) == 1 {
			if err := os.Remove(c.blobPath(e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("clean the wheel cache: %w", err)
			}
		}
	}
	return nil
}
