package safetar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Archive writes p to w as a tar stream whose top-level entry is named
// name: a regular file, a symbolic link (as a link: never followed) or a
// directory and everything below it, walked without following a link (a
// link inside the tree is archived as a link). The directories leading to p
// are resolved as the caller's own open would. A FIFO, socket or device, at
// the top or anywhere in the tree, fails the archive with a *TypeError
// naming it: a copy is never silently short of what it was asked for. The
// files' contents together may be at most maxBytes (0: no bound): past it,
// Archive fails with ErrTooLarge. A missing p fails with an error that is
// both fs.ErrNotExist and errdefs.ErrNotFound.
func Archive(w io.Writer, p, name string, maxBytes int64) error {
	dir, err := os.Open(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("archive %s: %w", p, notFound(err))
	}
	defer dir.Close()
	a := &archiver{tw: tar.NewWriter(w), max: maxBytes}
	if err := a.add(dir, filepath.Base(p), name, p); err != nil {
		var te *TypeError
		if errors.As(err, &te) {
			return err // it names the path
		}
		return fmt.Errorf("archive %s: %w", p, err)
	}
	return a.tw.Close()
}

// TypeError is the error of a path that a copy does not carry: neither a
// regular file, a directory nor a symbolic link. It is an
// errdefs.ErrInvalidArgument.
type TypeError struct {
	Path string // as the caller named it, or below it
	Type string // "a FIFO", "a socket", "a character device", "a block device"
}

func (e *TypeError) Error() string {
	return e.Path + " is " + e.Type + ": only regular files, directories and symbolic links are copied"
}

// Unwrap makes a TypeError an errdefs.ErrInvalidArgument.
func (e *TypeError) Unwrap() error { return errdefs.ErrInvalidArgument }

// typeName names the file type of mode (a stat's st_mode) for a TypeError;
// "" for the types a copy carries.
func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR, unix.S_IFLNK:
		return ""
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return fmt.Sprintf("of file type %#o", mode&unix.S_IFMT)
}

// Check returns nil if p, not followed, is a regular file, a symbolic link
// or a directory whose tree holds only those (walked without following a
// link): what Archive carries whole; a *TypeError naming the first other
// thing (a FIFO, socket or device) it finds; an error that is both
// fs.ErrNotExist and errdefs.ErrNotFound if p is not there. A copy checks
// first so that it is refused before it sends anything (Archive fails only
// when it reaches such a file, after the entries before it).
func Check(p string) error {
	dir, err := os.Open(filepath.Dir(p))
	if err != nil {
		return notFound(err)
	}
	defer dir.Close()
	if err := check(dir, filepath.Base(p), p); err != nil {
		var te *TypeError
		if errors.As(err, &te) {
			return err
		}
		return fmt.Errorf("check %s: %w", p, err)
	}
	return nil
}

// check checks entry base of dir, the path full.
func check(dir *os.File, base, full string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return notFound(&os.PathError{Op: "lstat", Path: full, Err: err})
	}
	if t := typeName(st.Mode); t != "" {
		return &TypeError{Path: full, Type: t}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	sub, err := openDir(dir, base)
	if err != nil {
		return err
	}
	defer sub.Close()
	names, err := sub.Readdirnames(-1)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		if err := check(sub, n, filepath.Join(full, n)); err != nil {
			return err
		}
	}
	return nil
}

// notFound adds errdefs.ErrNotFound to an error of a missing file.
func notFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	return err
}

type archiver struct {
	tw         *tar.Writer
	max, total int64
}

// add archives entry base of dir, the path full, as name.
func (a *archiver) add(dir *os.File, base, name, full string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", name, notFound(err))
	}
	mtime := time.Unix(st.Mtim.Sec, st.Mtim.Nsec)
	hdr := &tar.Header{Name: name, Mode: int64(st.Mode & 0o1777), ModTime: mtime, Format: tar.FormatPAX}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, err := readlinkat(dir, base)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return a.tw.WriteHeader(hdr)
	case unix.S_IFREG:
		return a.file(dir, base, hdr)
	case unix.S_IFDIR:
		sub, err := openDir(dir, base)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer sub.Close()
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if err := a.tw.WriteHeader(hdr); err != nil {
			return err
		}
		names, err := sub.Readdirnames(-1)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		sort.Strings(names)
		for _, n := range names {
			if err := a.add(sub, n, name+"/"+n, filepath.Join(full, n)); err != nil {
				return err
			}
		}
		return nil
	}
	return &TypeError{Path: full, Type: typeName(st.Mode)}
}

// file archives the regular file base of dir, opened without following a
// link (it may have been replaced since it was listed).
func (a *archiver) file(dir *os.File, base string, hdr *tar.Header) error {
	fd, err := unix.Openat(int(dir.Fd()), base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s: replaced while being copied", hdr.Name)
	}
	if a.max > 0 && a.total+st.Size > a.max {
		return fmt.Errorf("%s: the files are over %d bytes: %w", hdr.Name, a.max, ErrTooLarge)
	}
	a.total += st.Size
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if err := a.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := copyN(a.tw, f, st.Size)
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: it shrank while being copied (%d of %d bytes)", hdr.Name, n, st.Size)
	}
	return err
}

func readlinkat(dir *os.File, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
