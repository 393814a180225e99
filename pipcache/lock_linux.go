package pipcache

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/flmbox/flmbox/internal/flock"
)

// lock takes the cache's exclusive lock, waiting until it is free or ctx
// is done. The kernel releases it if the process dies.
func (c *Cache) lock(ctx context.Context) (unlock func(), err error) {
	l, err := flock.LockFile(ctx, filepath.Join(c.dir, "lock"), 0o600, flock.Exclusive)
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

// tryFlock takes an exclusive flock on fd if it is free.
func tryFlock(fd int) (bool, error) {
	err := flock.Try(fd, flock.Exclusive)
	if errors.Is(err, flock.ErrLocked) {
		return false, nil
	}
	return err == nil, err
}
