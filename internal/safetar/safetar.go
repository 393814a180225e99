// Package safetar reads and writes the tar streams of flmbox cp without
// ever following a symbolic link: inside a sandbox, where a snippet may
// have replaced any path under /tmp with a link between two calls, and on
// the host, where a stream from a sandbox is untrusted.
//
// Only directories, regular files and symbolic links are carried (a link
// is written as a link, never followed); hard links, devices, FIFOs and
// sockets are refused when extracting and left out when archiving.
// Ownership is not carried: files belong to whoever extracts them. Set-user
// and set-group-ID bits are dropped.
package safetar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"unsafe"
)

// Options bound and shape an extraction.
type Options struct {
	// MaxBytes bounds the bytes of the files' contents together (0: no
	// bound).
	MaxBytes int64
	// Top, if set, replaces the first component of every entry's name: a
	// stream of "data.csv" extracted with Top "in.csv" writes "in.csv".
	Top string
}

// ErrTooLarge is in the error of a stream past Options.MaxBytes.
var ErrTooLarge = fmt.Errorf("too large: %w", errdefs.ErrOutOfRange)

// Extract writes the tar stream r into the directory dir. Every component
// of every entry's name is opened with O_NOFOLLOW: an entry that would go
// through a symbolic link (one in the stream, or one that was there
// already) is refused, as are absolute names and names with "..". An
// existing file or link in the way of a file or link is replaced; an
// existing directory is kept (its mode unchanged). The modes of the
// directories it makes are set last, so that a read-only directory can be
// filled first.
func Extract(dir *os.File, r io.Reader, o Options) error {
	tr := tar.NewReader(r)
	var total int64
	type dirMode struct {
		path  string
		mode  uint32
		mtime time.Time
	}
	var dirs []dirMode
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read the archive: %w", err)
		}
		comps, err := entryPath(hdr.Name, o.Top)
		if err != nil {
			return err
		}
		if comps == nil {
			continue // the stream's root, ".", is dir itself
		}
		name := strings.Join(comps, "/")
		parent, err := openParents(dir, comps[:len(comps)-1])
		if err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
		last := comps[len(comps)-1]
		switch hdr.Typeflag {
		case tar.TypeDir:
			var made bool
			made, err = makeDir(parent, last)
			if err == nil && made {
				dirs = append(dirs, dirMode{name, uint32(hdr.Mode) & 0o1777, hdr.ModTime})
			}
		case tar.TypeReg, tar.TypeRegA:
			if o.MaxBytes > 0 && total+hdr.Size > o.MaxBytes {
				err = fmt.Errorf("the files are over %d bytes: %w", o.MaxBytes, ErrTooLarge)
				break
			}
			total += hdr.Size
			err = writeFile(parent, last, tr, hdr)
		case tar.TypeSymlink:
			if err = replaceable(parent, last); err == nil {
				err = unix.Symlinkat(hdr.Linkname, int(parent.Fd()), last)
			}
			if err == nil {
				setTimes(parent, last, hdr.ModTime)
			}
		default:
			err = fmt.Errorf("%s of type %q: only directories, regular files and symbolic links are copied: %w",
				name, hdr.Typeflag, errdefs.ErrInvalidArgument)
		}
		parent.Close()
		if err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- { // children before parents
		d := dirs[i]
		comps := strings.Split(d.path, "/")
		parent, err := openParents(dir, comps[:len(comps)-1])
		if err != nil {
			return fmt.Errorf("extract %s: %w", d.path, err)
		}
		f, err := openDir(parent, comps[len(comps)-1])
		if err == nil {
			err = unix.Fchmod(int(f.Fd()), d.mode)
			setTimes(f, "", d.mtime)
			f.Close()
		}
		parent.Close()
		if err != nil {
			return fmt.Errorf("extract %s: %w", d.path, err)
		}
	}
	return nil
}

// entryPath splits a tar entry's name into its components, Top replacing
// the first; nil for the stream's root. Absolute names and ".." are
// refused.
func entryPath(name, top string) ([]string, error) {
	if strings.HasPrefix(name, "/") || strings.ContainsRune(name, 0) {
		return nil, fmt.Errorf("archive entry %q: an absolute name: %w", name, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return nil, fmt.Errorf("archive entry %q: a name with \"..\": %w", name, errdefs.ErrInvalidArgument)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return nil, nil
	}
	comps := strings.Split(clean, "/")
	if top != "" {
		comps[0] = top
	}
	return comps, nil
}

// OpenDir opens the directory rel (a relative path) below dir, never
// following a link: a component that is a link, or not a directory, fails.
func OpenDir(dir *os.File, rel string) (*os.File, error) {
	cur, err := openDir(dir, ".")
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return cur, nil
	}
	for _, c := range strings.Split(rel, "/") {
		next, err := openDir(cur, c)
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// openParents opens the directory comps names below dir, making the
// directories missing (mode 0755), and never following a link.
func openParents(dir *os.File, comps []string) (*os.File, error) {
	cur, err := openDir(dir, ".")
	if err != nil {
		return nil, err
	}
	for _, c := range comps {
		next, err := openDir(cur, c)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(int(cur.Fd()), c, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openDir(cur, c)
			}
		}
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// openDir opens directory name in dir without following a link: a link
// fails with a clear error. It does not use O_DIRECTORY: gVisor follows a
// link opened with O_DIRECTORY|O_NOFOLLOW (Linux fails with ELOOP), so the
// type is checked on the open file instead.
func openDir(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link: refusing to go through it: %w", name, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a directory: refusing to go through it: %w", name, errdefs.ErrInvalidArgument)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// makeDir makes directory name in dir, or keeps one that is there (made
// is then false).
func makeDir(dir *os.File, name string) (made bool, err error) {
	err = unix.Mkdirat(int(dir.Fd()), name, 0o700)
	if errors.Is(err, unix.EEXIST) {
		f, err := openDir(dir, name)
		if err != nil {
			return false, err
		}
		return false, f.Close()
	}
	return err == nil, err
}

// replaceable removes what is at name in dir unless it is a directory
// (which a file or link does not replace: refused).
func replaceable(dir *os.File, name string) error {
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
	return unix.Unlinkat(int(dir.Fd()), name, 0)
}

// writeFile writes the regular file of hdr, its contents from r, as name
// in dir: a new file (O_EXCL, never through a link), its mode and time set.
func writeFile(dir *os.File, name string, r io.Reader, hdr *tar.Header) error {
	if err := replaceable(dir, name); err != nil {
		return err
	}
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if n, err := copyN(f, r, hdr.Size); err != nil {
		return fmt.Errorf("write (%d of %d bytes): %w", n, hdr.Size, err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o1777); err != nil {
		return err
	}
	setTimes(f, "", hdr.ModTime)
	return f.Close()
}

// setTimes sets the access and modification times of name in dir (of dir
// itself if name is ""), never following a link; best effort.
func setTimes(dir *os.File, name string, t time.Time) {
	if t.IsZero() {
		return
	}
	if name == "" {
		// futimens (utimensat on the descriptor itself): Futimes would
		// round to microseconds.
		ts := [2]unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
		unix.Syscall6(unix.SYS_UTIMENSAT, dir.Fd(), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
		return
	}
	ts := unix.NsecToTimespec(t.UnixNano())
	unix.UtimesNanoAt(int(dir.Fd()), name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// copyBytes is the buffer of a file's copy: under gVisor every read and
// write is a trip through the sentry, so a file of 100 MiB copied 32 KiB at
// a time (io.Copy's) took three times as long as with 1 MiB.
const copyBytes = 1 << 20

// copyN copies n bytes from r to w, in writes of copyBytes: each read
// fills the buffer (a socket gives some 200 KiB a read), so that a file is
// written in as few writes as it can be.
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
