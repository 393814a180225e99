package pipcache

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// lock takes the cache's exclusive lock, waiting until it is free or ctx
// is done. The kernel releases it if the process dies.
func (c *Cache) lock(ctx context.Context) (unlock func(), err error) {
	p := filepath.Join(c.dir, "lock")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the wheel cache's lock: %w", err)
	}
	for wait := time.Millisecond; ; wait = min(wait*2, 50*time.Millisecond) {
		ok, err := tryFlock(fd)
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("lock the wheel cache: %w", err)
		}
		if ok {
			return func() { unix.Close(fd) }, nil
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return nil, fmt.Errorf("wait for the wheel cache's lock: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
}

// tryFlock takes an exclusive flock on fd if it is free.
func tryFlock(fd int) (bool, error) {
	switch err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err {
	case nil:
		return true, nil
	case unix.EWOULDBLOCK, unix.EINTR:
		return false, nil
	default:
		return false, err
	}
}
