package flock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// TestModes: an exclusive lock excludes every other, shared ones exclude
// only an exclusive one, and Unlock frees them, for files and directories
// alike.
func TestModes(t *testing.T) {
	for _, tc := range []struct {
		name string
		try  func(path string, how Mode) (*Lock, error)
	}{
		{"file", func(p string, how Mode) (*Lock, error) { return TryLockFile(p, 0o600, how) }},
		{"dir", TryLockDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "x")
			if tc.name == "dir" {
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			ex, err := tc.try(p, Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			for _, how := range []Mode{Exclusive, Shared} {
				if _, err := tc.try(p, how); !errors.Is(err, ErrLocked) || !errdefs.IsUnavailable(err) {
					t.Errorf("try %d while held exclusively: %v, want ErrLocked", how, err)
				}
			}
			ex.Unlock()
			sh1, err := tc.try(p, Shared)
			if err != nil {
				t.Fatal(err)
			}
			sh2, err := tc.try(p, Shared)
			if err != nil {
				t.Fatalf("second shared lock: %v", err)
			}
			if _, err := tc.try(p, Exclusive); !errors.Is(err, ErrLocked) {
				t.Errorf("exclusive while shared: %v, want ErrLocked", err)
			}
			sh1.Unlock()
			sh2.Unlock()
			ex, err = tc.try(p, Exclusive)
			if err != nil {
				t.Fatalf("exclusive after unlock: %v", err)
			}
			ex.Unlock()
		})
	}
}

// TestTryLockFile: a missing file is made with the mode asked (under the
// umask); a symbolic link or a missing directory is refused.
func TestTryLockFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "made.lock")
	l, err := TryLockFile(p, 0o600, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v, %v; want a regular file of mode 0600", fi, err)
	}
	link := filepath.Join(dir, "link.lock")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, err := TryLockFile(link, 0o600, Exclusive); !errors.Is(err, unix.ELOOP) {
		t.Errorf("lock a symbolic link: %v, want ELOOP", err)
	}
	if _, err := TryLockDir(link, Exclusive); !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("lock a symbolic link as a directory: %v, want it refused", err)
	}
	if _, err := TryLockFile(filepath.Join(dir, "no", "x.lock"), 0o600, Exclusive); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock in a missing directory: %v, want ErrNotExist", err)
	}
}

// TestLockDirRemoved: a directory removed while its lock is awaited is not
// locked: the wait fails with ErrNotExist once its holder lets go.
func TestLockDirRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sb")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	held, err := TryLockDir(dir, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := LockDir(context.Background(), dir, Exclusive)
		if err == nil {
			l.Unlock()
		}
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	held.Unlock()
	if err := <-done; !errors.Is(err, os.ErrNotExist) {
		t.Errorf("wait for a removed directory: %v, want ErrNotExist", err)
	}
}

// TestReplacedWhileLocking: a file opened at a path that names another
// file once its lock is held (it was replaced meanwhile) is not locked.
func TestReplacedWhileLocking(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.lock")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := os.WriteFile(filepath.Join(dir, "new"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "new"), p); err != nil {
		t.Fatal(err)
	}
	if err := lockAt(fd, p, Exclusive); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock of a replaced file: %v, want ErrNotExist", err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := lockAt(fd, p, Exclusive); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock of a removed file: %v, want ErrNotExist", err)
	}
}

// TestLockWaits: a waiting lock is taken soon after its holder lets go,
// and gives up when its context ends, with the context's cause.
func TestLockWaits(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	held, err := TryLockFile(p, 0o600, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := LockFile(ctx, p, 0o600, Shared); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrLocked) {
		t.Errorf("wait past the deadline: %v, want DeadlineExceeded", err)
	}
	cause := errors.New("told to stop")
	cctx, stop := context.WithCancelCause(context.Background())
	stop(cause)
	if _, err := LockFile(cctx, p, 0o600, Exclusive); !errors.Is(err, cause) {
		t.Errorf("wait with a cancelled context: %v, want its cause", err)
	}

	go func() {
		time.Sleep(30 * time.Millisecond)
		held.Unlock()
	}()
	start := time.Now()
	l, err := LockFile(context.Background(), p, 0o600, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	if d := time.Since(start); d > 30*time.Millisecond+MaxPoll+time.Second {
		t.Errorf("took the lock %s after the wait began, long after it was freed", d)
	}
}

// TestTry: a lock on a descriptor, freed when it is closed.
func TestTry(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x")
	open := func() int {
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	a, b := open(), open()
	defer unix.Close(b)
	if err := Try(a, Exclusive); err != nil {
		t.Fatal(err)
	}
	if err := Try(b, Shared); !errors.Is(err, ErrLocked) {
		t.Errorf("try while held: %v, want ErrLocked", err)
	}
	unix.Close(a)
	if err := Try(b, Exclusive); err != nil {
		t.Errorf("try once the holder closed it: %v", err)
	}
	if err := Try(-1, Exclusive); err == nil || errors.Is(err, ErrLocked) {
		t.Errorf("try a bad descriptor: %v, want EBADF", err)
	}
}
