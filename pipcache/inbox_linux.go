package pipcache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// inboxInodes bounds the number of files an inbox can hold.
const inboxInodes = 4096

// staleAfter is how long an unlocked entry of tmp/ must have been left
// alone before a sweep removes it (it closes the short window between
// creating a staging file and locking it).
const staleAfter = time.Minute

// Inbox is a directory that an untrusted writer (pip download in a
// sandbox) fills with wheels, for AddInbox to import: a tmpfs of bounded
// size and file count, so that the writer cannot fill the host's disk,
// owned by the writer's user, under the cache's tmp/. Close unmounts it.
// An inbox left by a killed process is removed by the next import.
type Inbox struct {
	// Dir is the directory to give the writer.
	Dir string
	fd  int // the tmpfs's root, locked while the inbox lives
}

// NewInbox mounts a new inbox of at most maxBytes, owned by uid:gid (mode
// 0700). It needs root (CAP_SYS_ADMIN).
func (c *Cache) NewInbox(maxBytes int64, uid, gid int) (_ *Inbox, err error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("inbox size %d: want a positive size: %w", maxBytes, errdefs.ErrInvalidArgument)
	}
	dir, err := os.MkdirTemp(c.tmpDir(), "inbox-")
	if err != nil {
		return nil, fmt.Errorf("create an inbox for wheels: %w", err)
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", maxBytes, inboxInodes, uid, gid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("mount a tmpfs for wheels on %s: %w", dir, err)
	}
	in := &Inbox{Dir: dir, fd: -1}
	defer func() {
		if err != nil {
			in.Close()
		}
	}()
	if in.fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("open inbox %s: %w", dir, err)
	}
	if _, err := tryFlock(in.fd); err != nil {
		return nil, fmt.Errorf("lock inbox %s: %w", dir, err)
	}
	return in, nil
}

// Close unmounts and removes the inbox and whatever it holds.
func (in *Inbox) Close() error {
	if in.fd >= 0 {
		unix.Close(in.fd)
		in.fd = -1
	}
	if err := unix.Unmount(in.Dir, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount inbox %s: %w", in.Dir, err)
	}
	return os.Remove(in.Dir)
}

// AddInbox imports every wheel in the inbox, all or none, as Add does. The
// inbox's writer is untrusted: its entries are opened without following
// symbolic links, and anything but regular .whl files is refused.
func (c *Cache) AddInbox(ctx context.Context, in *Inbox) ([]*Wheel, error) {
	ents, err := os.ReadDir(in.Dir)
	if err != nil {
		return nil, fmt.Errorf("read inbox: %w", err)
	}
	var srcs []source
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".whl") || !e.Type().IsRegular() {
			return nil, fmt.Errorf("the download left %q, which is not a wheel file; nothing was imported: %w", name, errdefs.ErrInvalidArgument)
		}
		srcs = append(srcs, source{name: name, open: func() (*os.File, error) {
			fd, err := unix.Openat(in.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, &os.PathError{Op: "open", Path: filepath.Join(in.Dir, name), Err: err}
			}
			return os.NewFile(uintptr(fd), filepath.Join(in.Dir, name)), nil
		}})
	}
	if len(srcs) == 0 {
		return []*Wheel{}, nil
	}
	return c.add(ctx, srcs)
}

// sweepTmp removes what killed imports left in tmp/: staging files and
// inboxes that nobody holds locked and that were not touched for
// staleAfter. Called under the cache's lock.
func (c *Cache) sweepTmp() {
	ents, err := os.ReadDir(c.tmpDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(c.tmpDir(), e.Name())
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		free, _ := tryFlock(fd)
		stale := unix.Fstat(fd, &st) == nil && time.Since(time.Unix(st.Mtim.Unix())) > staleAfter
		unix.Close(fd)
		if !free || !stale {
			continue
		}
		if e.IsDir() {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				continue
			}
		}
		os.RemoveAll(p)
	}
}
