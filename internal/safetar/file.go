package safetar

import (
	"archive/tar"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// tmpPrefix begins the temporary names of files and links being extracted.
const tmpPrefix = ".flmbox-cp-"

// holeBytes is the block that extraction leaves as a hole when it is all
// zeros: the page of the filesystems flmbox writes to (a tmpfs counts the
// pages written, a disk its blocks).
const holeBytes = 4096

// writeFile writes the regular file of hdr, its contents from r, as name
// in parent (dirRel below the root): a new file under a temporary name
// (O_EXCL, never through a link), its mode and time set, then put in place
// (see place). A failure removes it.
func (e *extractor) writeFile(parent *os.File, dirRel, name string, r io.Reader, hdr *tar.Header) error {
	if err := noDirInTheWay(parent, name); err != nil {
		return err
	}
	fd, tmp, err := createTemp(parent, func(tmp string) (int, error) {
		return unix.Openat(int(parent.Fd()), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	})
	if err != nil {
		return kinded(err)
	}
	f := os.NewFile(uintptr(fd), name) // its errors name the file, not its temporary name
	err = writeSparse(f, r, hdr.Size)
	if err == nil {
		err = unix.Fchmod(fd, uint32(hdr.Mode)&0o1777)
	}
	if err == nil {
		setTimes(f, "", hdr.ModTime)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		unix.Unlinkat(int(parent.Fd()), tmp, 0)
		return kinded(err)
	}
	return e.place(parent, dirRel, tmp, name)
}

// symlink makes the symbolic link of hdr as name in parent: under a
// temporary name, then put in place (see place).
func (e *extractor) symlink(parent *os.File, dirRel, name string, hdr *tar.Header) error {
	if err := noDirInTheWay(parent, name); err != nil {
		return err
	}
	_, tmp, err := createTemp(parent, func(tmp string) (int, error) {
		return -1, unix.Symlinkat(hdr.Linkname, int(parent.Fd()), tmp)
	})
	if err != nil {
		return kinded(err)
	}
	setTimes(parent, tmp, hdr.ModTime)
	return e.place(parent, dirRel, tmp, name)
}

// place renames tmp in parent to name, replacing a file or link there;
// with Options.Atomic, it only notes it for commit.
func (e *extractor) place(parent *os.File, dirRel, tmp, name string) error {
	if e.o.Atomic {
		e.pending = append(e.pending, staged{dirRel, tmp, name})
		return nil
	}
	if err := unix.Renameat(int(parent.Fd()), tmp, int(parent.Fd()), name); err != nil {
		unix.Unlinkat(int(parent.Fd()), tmp, 0)
		return err
	}
	return nil
}

// commit puts in place what an Atomic extraction staged, in the stream's
// order (a later entry of the same name wins).
func (e *extractor) commit() error {
	var dir *os.File
	var dirRel string
	defer func() {
		if dir != nil {
			dir.Close()
		}
	}()
	for i, s := range e.pending {
		if dir == nil || s.dir != dirRel {
			if dir != nil {
				dir.Close()
			}
			var err error
			if dir, err = OpenDir(e.root, s.dir); err != nil {
				dir = nil
				e.pending = e.pending[i:]
				return fmt.Errorf("extract %s: %w", s.name, err)
			}
			dirRel = s.dir
		}
		if err := unix.Renameat(int(dir.Fd()), s.tmp, int(dir.Fd()), s.name); err != nil {
			e.pending = e.pending[i:]
			return fmt.Errorf("extract %s: %w", s.name, err)
		}
	}
	e.pending = nil
	return nil
}

// rollback removes what a failed Atomic extraction staged and the
// directories it made (best effort: a directory that holds something else
// now is kept).
func (e *extractor) rollback() {
	for _, s := range e.pending {
		if dir, err := OpenDir(e.root, s.dir); err == nil {
			unix.Unlinkat(int(dir.Fd()), s.tmp, 0)
			dir.Close()
		}
	}
	e.pending = nil
	for i := len(e.made) - 1; i >= 0; i-- { // children before parents
		p := e.made[i]
		parentRel, base := ".", p
		if j := strings.LastIndexByte(p, '/'); j >= 0 {
			parentRel, base = p[:j], p[j+1:]
		}
		if dir, err := OpenDir(e.root, parentRel); err == nil {
			unix.Unlinkat(int(dir.Fd()), base, unix.AT_REMOVEDIR)
			dir.Close()
		}
	}
	e.made = nil
}

// createTemp calls mk with a new temporary name in dir until it does not
// fail with EEXIST.
func createTemp(dir *os.File, mk func(tmp string) (int, error)) (int, string, error) {
	for range 100 {
		var b [8]byte
		for i := range b {
			b[i] = byte(rand.Uint32())
		}
		tmp := tmpPrefix + hex.EncodeToString(b[:])
		fd, err := mk(tmp)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		return fd, tmp, err
	}
	return -1, "", fmt.Errorf("no free temporary name in the directory: %w", unix.EEXIST)
}

// noDirInTheWay fails if name in dir is a directory, which a file or link
// does not replace.
func noDirInTheWay(dir *os.File, name string) error {
	var st unix.Stat_t
	err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("a directory is in the way: %w", errdefs.ErrAlreadyExists)
	}
	return nil
}

// kinded adds errdefs.ErrResourceExhausted to an error of a full
// filesystem or an exceeded quota.
func kinded(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	}
	return err
}

// copyBytes is the buffer of a file's copy: under gVisor every read and
// write is a trip through the sentry, so a large buffer copies far faster
// than io.Copy's (docs/PERFORMANCE.md, "internal/safetar: a file's copy").
const copyBytes = 1 << 20

// zeros is a block of holeBytes zeros.
var zeros [holeBytes]byte

// writeSparse writes n bytes read from r to the new, empty file f, in
// writes of up to copyBytes (each read fills the buffer: a socket gives
// some 200 KiB a read), leaving each block of holeBytes zeros a hole: the
// file's size is set at the end.
func writeSparse(f *os.File, r io.Reader, n int64) error {
	buf := make([]byte, min(n, copyBytes))
	var off int64
	for off < n {
		k, err := io.ReadFull(r, buf[:min(int64(len(buf)), n-off)])
		if k > 0 {
			if werr := writeData(f, buf[:k], off); werr != nil {
				return fmt.Errorf("write (%d of %d bytes): %w", off, n, werr)
			}
			off += int64(k)
		}
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		if err != nil {
			return fmt.Errorf("write (%d of %d bytes): %w", off, n, err)
		}
	}
	if err := f.Truncate(n); err != nil {
		return fmt.Errorf("write (%d bytes): %w", n, err)
	}
	return nil
}

// writeData writes b at off in f, but for its blocks of holeBytes zeros
// (off is a multiple of holeBytes).
func writeData(f *os.File, b []byte, off int64) error {
	for i := 0; i < len(b); {
		for i < len(b) && isZero(b[i:min(i+holeBytes, len(b))]) {
			i += holeBytes
		}
		j := i
		for j < len(b) && !isZero(b[j:min(j+holeBytes, len(b))]) {
			j += holeBytes
		}
		j = min(j, len(b))
		if j > i {
			if _, err := f.WriteAt(b[i:j], off+int64(i)); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }

// copyN copies n bytes from r to w, in writes of copyBytes: each read
// fills the buffer, so that a file is sent in as few writes as it can be.
func copyN(w io.Writer, r io.Reader, n int64) (int64, error) {
	buf := make([]byte, min(n, copyBytes))
	var done int64
	for done < n {
		k, err := io.ReadFull(r, buf[:min(int64(len(buf)), n-done)])
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return done, werr
			}
			done += int64(k)
		}
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}
