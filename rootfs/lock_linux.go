package rootfs

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// lock takes the exclusive file lock of entry hex, waiting until it is free
// or ctx is done. The lock is released by the returned function, or by the
// kernel when the process dies, so a killed pull never blocks the next one.
func (s *Store) lock(ctx context.Context, hex string) (func(), error) {
	wait := time.Millisecond
	for {
		unlock, ok, err := s.flock(hex)
		if err != nil {
			return nil, err
		}
		if ok {
			return unlock, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the lock of image %s: %w", hex[:12], ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}

// tryLock takes the lock of entry hex if it is free.
func (s *Store) tryLock(hex string) (func(), bool) {
	unlock, ok, err := s.flock(hex)
	if err != nil || !ok {
		return nil, false
	}
	return unlock, true
}

func (s *Store) flock(hex string) (unlock func(), ok bool, err error) {
	p := filepath.Join(s.dir, "locks", hex+".lock")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("open lock %s: %w", p, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if err == unix.EWOULDBLOCK || err == unix.EINTR {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", p, err)
	}
	return func() { unix.Close(fd) }, true, nil
}
