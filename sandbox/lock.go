package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/flmbox/flmbox/internal/flock"
)

// The lock of a sandbox's directory is held while the sandbox is created
// or removed, so that Reconcile tells a Create or Remove at work from one
// that was killed (the kernel drops a dead process's locks).

// errLocked is in tryLock's and lockFile's failure when another holds the
// lock.
var errLocked = flock.ErrLocked

// tryLock takes the lock of directory dir, or fails at once with errLocked.
// The lock is of the directory at dir once it is held: one that its holder
// removed (or renamed) meanwhile fails with unix.ENOENT.
func tryLock(dir string) (*flock.Lock, error) { return flock.TryLockDir(dir, flock.Exclusive) }

// lock takes the lock of directory dir, waiting while another holds it
// until ctx is done.
func lock(ctx context.Context, dir string) (*flock.Lock, error) {
	return flock.LockDir(ctx, dir, flock.Exclusive)
}

// lockFile takes the lock of path, a file of the pool's directory (made if
// need be); if wait, it waits until ctx is done, else it fails at once
// with errLocked.
func lockFile(ctx context.Context, path string, wait bool) (*flock.Lock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if !wait {
		return flock.TryLockFile(path, 0o600, flock.Exclusive)
	}
	return flock.LockFile(ctx, path, 0o600, flock.Exclusive)
}
