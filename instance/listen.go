package instance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/flmbox/flmbox/internal/flock"
)

// MaxSocketPath is the longest path of a Unix socket, in bytes: sun_path
// holds 108 with the terminating NUL.
const MaxSocketPath = 107

// probeTimeout bounds Listen's connection to a socket found at its path: a
// server that answers takes microseconds.
const probeTimeout = time.Second

// Listener is a Unix socket that Listen made. Its Close removes the
// socket's file, but only while the file at its path is the one it made:
// never another process's socket made there since.
type Listener struct {
	*net.UnixListener
	path     string
	dev, ino uint64 // the socket file's; ino is 0 for an abstract socket
	closed   sync.Once
	err      error
}

// Listen makes a Unix socket at path and listens on it. It refuses a path
// too long for a Unix socket (InvalidArgument), a path where something other
// than a socket exists (AlreadyExists), and a socket that a server answers
// on (Conflict); it replaces only a stale socket, one that refuses
// connections (its server is gone). Two processes that Listen on one path
// at once take turns (a lock on the directory), so that the second finds
// the first's socket live rather than removing it. A path that starts with
// '@' is an abstract socket, with no file.
func Listen(path string) (*Listener, error) {
	switch {
	case path == "":
		return nil, fmt.Errorf("listen: no socket path: %w", errdefs.ErrInvalidArgument)
	case len(path) > MaxSocketPath:
		return nil, fmt.Errorf("listen on %s: the path is %d bytes, more than a Unix socket's %d (108 with its NUL): choose a shorter one: %w",
			path, len(path), MaxSocketPath, errdefs.ErrInvalidArgument)
	case path[0] == '@':
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", path, err)
		}
		return &Listener{UnixListener: ln, path: path}, nil
	}
	unlock, err := lockDir(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	defer unlock()
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Go would remove whatever is at path when the listener closes.
	ln.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	l := &Listener{UnixListener: ln, path: path}
	l.dev, l.ino = fileID(fi)
	return l, nil
}

// removeStale removes the socket at path if no server answers on it, and
// refuses anything else found there.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("listen on %s: %w", path, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("listen on %s: it exists and is not a socket (%s): choose another path: %w", path, typeName(fi.Mode()), errdefs.ErrAlreadyExists)
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	if err == nil {
		c.Close()
		return fmt.Errorf("listen on %s: the socket is in use, a server answers on it (another flmbox instance?): give each its own socket: %w", path, errdefs.ErrConflict)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("listen on %s: a socket is there and connecting to it failed (%w): remove it if no server uses it: %w", path, err, errdefs.ErrConflict)
	}
	// Stale: its server is gone. Remove it if it is still the file probed.
	now, err := os.Lstat(path)
	if err == nil && sameFile(fi, now) {
		err = os.Remove(path)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("listen on %s: remove the stale socket: %w", path, err)
	}
	return nil
}

// Close stops listening and removes the socket's file if it is still the
// one Listen made. It may be called more than once.
func (l *Listener) Close() error {
	l.closed.Do(func() {
		l.err = l.UnixListener.Close()
		if l.ino == 0 {
			return
		}
		unlock, err := lockDir(filepath.Dir(l.path))
		if err == nil {
			defer unlock()
		}
		fi, err := os.Lstat(l.path)
		if err != nil {
			return // gone already
		}
		if dev, ino := fileID(fi); dev == l.dev && ino == l.ino {
			if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) && l.err == nil {
				l.err = fmt.Errorf("remove socket %s: %w", l.path, err)
			}
		}
	})
	return l.err
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// lockDir takes an exclusive lock on directory dir and returns what
// releases it.
func lockDir(dir string) (unlock func(), err error) {
	l, err := flock.LockDir(context.Background(), dir, flock.Exclusive)
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

func fileID(fi fs.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), st.Ino
	}
	return 0, 0
}

func sameFile(a, b fs.FileInfo) bool {
	ad, ai := fileID(a)
	bd, bi := fileID(b)
	return ad == bd && ai == bi && ai != 0
}

// typeName says what kind of file mode is, for an error.
func typeName(mode fs.FileMode) string {
	switch mode.Type() {
	case 0:
		return "a regular file"
	case fs.ModeDir:
		return "a directory"
	case fs.ModeSymlink:
		return "a symbolic link"
	case fs.ModeNamedPipe:
		return "a named pipe"
	case fs.ModeDevice, fs.ModeDevice | fs.ModeCharDevice:
		return "a device"
	}
	return mode.Type().String()
}
