package rootfs

import (
	"context"
	"path/filepath"

	"github.com/flmbox/flmbox/internal/flock"
)

// lock takes the exclusive file lock of entry hex, waiting until it is free
// or ctx is done. The lock is released by the returned function, or by the
// kernel when the process dies, so a killed pull never blocks the next one.
func (s *Store) lock(ctx context.Context, hex string) (func(), error) {
	l, err := flock.LockFile(ctx, s.lockPath(hex), 0o600, flock.Exclusive)
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

// tryLock takes the lock of entry hex if it is free.
func (s *Store) tryLock(hex string) (func(), bool) {
	l, err := flock.TryLockFile(s.lockPath(hex), 0o600, flock.Exclusive)
	if err != nil {
		return nil, false
	}
	return l.Unlock, true
}

func (s *Store) lockPath(hex string) string { return filepath.Join(s.dir, "locks", hex+".lock") }
