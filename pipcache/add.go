package pipcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// source is a wheel to import: the name to serve it as, and how to open it.
type source struct {
	name string
	open func() (*os.File, error)
}

// staged is a validated private copy of a wheel in tmp/, held open (and
// locked, so that a sweep leaves it alone) until it is committed or
// discarded.
type staged struct {
	path  string
	file  *os.File
	hex   string
	wheel *Wheel
}

// Add validates the wheel files at paths (symbolic links are followed:
// these are the operator's paths) and imports them, all or none: if one
// file is refused, nothing is imported. Each file is served under its base
// name. A wheel already in the cache with the same content is reported with
// AlreadyCached; one with the same filename and other content is refused
// with a *ConflictError (errdefs.ErrAlreadyExists) until it is removed.
func (c *Cache) Add(ctx context.Context, paths []string) ([]*Wheel, error) {
	srcs := make([]source, len(paths))
	for i, p := range paths {
		srcs[i] = source{name: filepath.Base(p), open: func() (*os.File, error) {
			return os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		}}
	}
	return c.add(ctx, srcs)
}

func (c *Cache) add(ctx context.Context, srcs []source) ([]*Wheel, error) {
	var stg []*staged
	defer func() {
		for _, s := range stg {
			s.discard()
		}
	}()
	// Validation is the slow part; it runs without the lock, on copies
	// that nothing else can change.
	byName := map[string]string{}
	for _, src := range srcs {
		s, err := c.stage(ctx, src)
		if err != nil {
			return nil, fmt.Errorf("%w; nothing was imported", err)
		}
		stg = append(stg, s)
		if hex, seen := byName[src.name]; seen && hex != s.hex {
			return nil, fmt.Errorf("two different files named %s; nothing was imported: %w", src.name, errdefs.ErrInvalidArgument)
		}
		byName[src.name] = s.hex
	}
	unlock, err := c.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	c.sweepTmp()
	for _, s := range stg {
		if err := c.checkConflict(s); err != nil {
			return nil, fmt.Errorf("%w; nothing was imported", err)
		}
	}
	var out []*Wheel
	for _, s := range stg {
		if err := c.commit(s); err != nil {
			return out, err
		}
		out = append(out, s.wheel)
	}
	return out, nil
}

// stage copies src into tmp/ while hashing it, then validates the copy.
func (c *Cache) stage(ctx context.Context, src source) (_ *staged, err error) {
	limits := c.limits.withDefaults()
	f, err := src.open()
	if err != nil {
		return nil, fmt.Errorf("open wheel %s: %w", src.name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open wheel %s: %w", src.name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("wheel %s is not a regular file: %w", src.name, errdefs.ErrInvalidArgument)
	}
	if fi.Size() > limits.MaxWheelBytes {
		return nil, fmt.Errorf("wheel %s is %d bytes, more than the limit of %d: %w", src.name, fi.Size(), limits.MaxWheelBytes, errdefs.ErrInvalidArgument)
	}
	tmp, err := os.CreateTemp(c.tmpDir(), "add-*.whl")
	if err != nil {
		return nil, fmt.Errorf("stage wheel %s: %w", src.name, err)
	}
	s := &staged{path: tmp.Name(), file: tmp}
	defer func() {
		if err != nil {
			s.discard()
		}
	}()
	if _, err := tryFlock(int(tmp.Fd())); err != nil {
		return nil, fmt.Errorf("stage wheel %s: %w", src.name, err)
	}
	h := sha256.New()
	n, err := copyWithContext(ctx, io.MultiWriter(tmp, h), io.LimitReader(f, limits.MaxWheelBytes+1))
	if err != nil {
		return nil, fmt.Errorf("copy wheel %s: %w", src.name, err)
	}
	if n > limits.MaxWheelBytes {
		return nil, fmt.Errorf("wheel %s is more than the limit of %d bytes: %w", src.name, limits.MaxWheelBytes, errdefs.ErrInvalidArgument)
	}
	if s.wheel, err = Validate(ctx, tmp, n, src.name, &limits); err != nil {
		return nil, err
	}
	s.hex = hex.EncodeToString(h.Sum(nil))
	s.wheel.Digest = "sha256:" + s.hex
	return s, nil
}

// discard removes a staged copy (a no-op once it was committed).
func (s *staged) discard() {
	s.file.Close()
	if s.path != "" {
		os.Remove(s.path)
	}
}

// checkConflict refuses a wheel whose filename the cache already serves
// with other content. Called under the lock.
func (c *Cache) checkConflict(s *staged) error {
	have, err := os.Lstat(c.wheelPath(s.wheel.Filename))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check the wheel cache for %s: %w", s.wheel.Filename, err)
	}
	if blob, err := os.Stat(c.blobPath(s.hex)); err == nil && os.SameFile(have, blob) {
		return nil
	}
	return &ConflictError{Filename: s.wheel.Filename, Name: s.wheel.Name, Version: s.wheel.Version}
}

// ConflictError reports a wheel whose filename the cache already serves with
// other content; the cache changes a served wheel only once it is removed.
// It matches errdefs.ErrAlreadyExists.
type ConflictError struct {
	// Filename is the wheel's file name; Name (normalized) and Version are
	// the project's, as the refused wheel's METADATA gives them.
	Filename, Name, Version string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("the cache already holds another %s", e.Filename)
}

// Is makes a ConflictError match errdefs.ErrAlreadyExists.
func (e *ConflictError) Is(target error) bool {
	return target == errdefs.ErrAlreadyExists
}

// commit publishes a staged wheel: its blob (by rename, unless the same
// content is already there), then its link in wheels/. Called under the
// lock, after checkConflict.
func (c *Cache) commit(s *staged) error {
	blob := c.blobPath(s.hex)
	if _, err := os.Stat(blob); errors.Is(err, fs.ErrNotExist) {
		now := time.Now()
		if err := s.file.Chmod(0o644); err != nil {
			return fmt.Errorf("import wheel %s: %w", s.wheel.Filename, err)
		}
		if err := s.file.Sync(); err != nil {
			return fmt.Errorf("import wheel %s: %w", s.wheel.Filename, err)
		}
		if err := os.Chtimes(s.path, now, now); err != nil {
			return fmt.Errorf("import wheel %s: %w", s.wheel.Filename, err)
		}
		if err := os.Rename(s.path, blob); err != nil {
			return fmt.Errorf("import wheel %s: %w", s.wheel.Filename, err)
		}
		s.path = "" // the blob now: discard must not remove it
	} else if err != nil {
		return fmt.Errorf("import wheel %s: %w", s.wheel.Filename, err)
	}
	err := os.Link(blob, c.wheelPath(s.wheel.Filename))
	if errors.Is(err, fs.ErrExist) {
		s.wheel.AlreadyCached = true // checkConflict found the same content
	} else if err != nil {
		return fmt.Errorf("import wheel %s: %w", s.wheel.Filename, err)
	}
	if fi, err := os.Stat(blob); err == nil {
		s.wheel.Added = fi.ModTime().UTC()
	}
	return nil
}
