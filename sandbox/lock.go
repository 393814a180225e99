package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// dirLock is the flock of a sandbox's directory: held while the sandbox is
// created or removed, so that Reconcile tells a Create or Remove at work
// from one that was killed (the kernel drops a dead process's locks).
type dirLock struct{ fd int }

// errLocked is tryLock's failure when another holds the lock.
var errLocked = errors.New("locked")

// tryLock takes the lock of directory dir, or fails at once with errLocked.
// The lock is of the directory at dir once it is held: one that its holder
// removed (or renamed) meanwhile fails with unix.ENOENT.
func tryLock(dir string) (*dirLock, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	var held, now unix.Stat_t
	if err := unix.Fstat(fd, &held); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := unix.Lstat(dir, &now); err != nil || now.Dev != held.Dev || now.Ino != held.Ino {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: removed while locking: %w", dir, unix.ENOENT)
	}
	return &dirLock{fd: fd}, nil
}

// lock takes the lock of directory dir, waiting while another holds it
// until ctx is done.
func lock(ctx context.Context, dir string) (*dirLock, error) {
	for {
		l, err := tryLock(dir)
		if !errors.Is(err, errLocked) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for another process to finish creating or removing %s: %w", dir, context.Cause(ctx))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (l *dirLock) unlock() { unix.Close(l.fd) }
