// Package flock locks files and directories with flock(2), the lock that
// flmbox's processes share a state root by: a Create, a Remove or a pool
// refill in one process locks out the others, and the kernel releases a
// lock when its holder dies, so a killed process never blocks the next.
//
// A lock is of the file open at its path when it is taken: one removed or
// replaced while it was being taken is not held (the error is ENOENT, an
// os.ErrNotExist), so holding the lock of a path means that the path names
// the locked file.
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"golang.org/x/sys/unix"
)

// ErrLocked is in the error of a try when another open file holds a
// conflicting lock. It is errdefs.ErrUnavailable: the lock may be free
// later.
var ErrLocked = errkind.New(errdefs.ErrUnavailable, "held by another")

// Mode is how a lock is held.
type Mode int

const (
	// Exclusive is held by one open file at a time.
	Exclusive Mode = unix.LOCK_EX
	// Shared is held by any number of open files at once, and by none
	// while one holds Exclusive.
	Shared Mode = unix.LOCK_SH
)

// MaxPoll is the longest a waiting lock sleeps between tries: a lock
// freed by its holder is taken within MaxPoll (the first tries come
// sooner, 1ms apart then doubling).
const MaxPoll = 10 * time.Millisecond

// Lock is a held lock. Unlock releases it; so does the kernel when the
// holding process ends.
type Lock struct{ fd int }

// Unlock releases the lock.
func (l *Lock) Unlock() { unix.Close(l.fd) }

// Try takes a lock of mode how on the open file fd if it is free, and
// fails with ErrLocked otherwise. The lock is released when the last
// descriptor of the open file is closed.
func Try(fd int, how Mode) error {
	for {
		err := unix.Flock(fd, int(how)|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EWOULDBLOCK):
			return ErrLocked
		default:
			return err
		}
	}
}

// TryLockFile takes a lock of mode how on the file at path, creating it
// (with mode perm) if it is missing, or fails at once with ErrLocked. A
// symbolic link is not followed.
func TryLockFile(path string, perm os.FileMode, how Mode) (*Lock, error) {
	return try(path, unix.O_RDWR|unix.O_CREAT, uint32(perm.Perm()), how)
}

// LockFile takes a lock as TryLockFile does, waiting while another holds
// it until ctx is done.
func LockFile(ctx context.Context, path string, perm os.FileMode, how Mode) (*Lock, error) {
	return wait(ctx, path, func() (*Lock, error) { return TryLockFile(path, perm, how) })
}

// TryLockDir takes a lock of mode how on directory dir, or fails at once
// with ErrLocked. A symbolic link is not followed.
func TryLockDir(dir string, how Mode) (*Lock, error) {
	return try(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0, how)
}

// LockDir takes a lock as TryLockDir does, waiting while another holds it
// until ctx is done.
func LockDir(ctx context.Context, dir string, how Mode) (*Lock, error) {
	return wait(ctx, dir, func() (*Lock, error) { return TryLockDir(dir, how) })
}

// try opens path with flags and takes its lock.
func try(path string, flags int, perm uint32, how Mode) (*Lock, error) {
	fd, err := unix.Open(path, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := lockAt(fd, path, how); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &Lock{fd: fd}, nil
}

// lockAt takes the lock of fd, opened at path, if path still names it once
// the lock is held.
func lockAt(fd int, path string, how Mode) error {
	if err := Try(fd, how); err != nil {
		return err
	}
	var held, now unix.Stat_t
	if err := unix.Fstat(fd, &held); err != nil {
		return err
	}
	if err := unix.Lstat(path, &now); err != nil || now.Dev != held.Dev || now.Ino != held.Ino {
		return fmt.Errorf("removed while locking: %w", unix.ENOENT)
	}
	return nil
}

// wait calls try until it takes the lock of path, fails otherwise than
// with ErrLocked, or ctx is done. Each try opens path again: a waiter
// locks what path names when its holder lets go.
func wait(ctx context.Context, path string, try func() (*Lock, error)) (*Lock, error) {
	for sleep := time.Millisecond; ; sleep = min(2*sleep, MaxPoll) {
		l, err := try()
		if !errors.Is(err, ErrLocked) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the lock of %s: %w", path, context.Cause(ctx))
		case <-time.After(sleep):
		}
	}
}
