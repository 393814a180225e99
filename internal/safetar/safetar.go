// Package safetar reads and writes the tar streams of flmbox cp without
// ever following a symbolic link: inside a sandbox, where a snippet may
// have replaced any path under /tmp with a link between two calls, and on
// the host, where a stream from a sandbox is untrusted.
//
// Only directories, regular files and symbolic links are carried (a link
// is written as a link, never followed); hard links, devices, FIFOs and
// sockets are refused, when extracting and when archiving (a *TypeError
// naming the path): a copy is refused rather than silently short, which is
// simpler to reason about than a skip with a warning. Ownership is not
// carried: files belong to whoever extracts them. Set-user and
// set-group-ID bits are dropped. Sparse files stay sparse: a stream carries
// holes as zeros, and extraction leaves each all-zero block a hole. A file
// is never left partial: it is written under a temporary name and renamed
// when whole (Options.Atomic: when the whole stream is).
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

	"github.com/flmbox/flmbox/internal/errkind"
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
	// Atomic puts nothing in place until the whole stream has been read,
	// to the end of r, without an error: files and links are written under
	// temporary names and renamed into place at the end. A failure removes
	// them and the directories the extraction made, so that it leaves
	// nothing that was not there (for a stream from a sandbox, whose end
	// says whether the copy succeeded). Without it, each file is renamed
	// into place as soon as it is whole: a failure leaves the files and
	// directories finished before it, never a partial file.
	Atomic bool
}

// ErrTooLarge is in the error of a stream past Options.MaxBytes.
var ErrTooLarge = errkind.New(errdefs.ErrOutOfRange, "too large: out of range")

// Extract writes the tar stream r into the directory dir. Every component
// of every entry's name is opened with O_NOFOLLOW: an entry that would go
// through a symbolic link (one in the stream, or one that was there
// already) is refused, as are absolute names and names with "..". An
// existing file or link in the way of a file or link is replaced (by a
// rename: atomically); an existing directory is kept (its mode unchanged).
// Each file is written under a temporary name in its directory and renamed
// when whole (see Options.Atomic), with holes where its contents are zero
// blocks (a sparse file stays sparse: a tar stream carries its holes as
// zeros). The modes of the directories it makes are set last, so that a
// read-only directory can be filled first.
func Extract(dir *os.File, r io.Reader, o Options) (err error) {
	e := &extractor{root: dir, o: o}
	if o.Atomic {
		defer func() {
			if err != nil {
				e.rollback()
			}
		}()
	}
	if err := e.entries(r); err != nil {
		return err
	}
	if o.Atomic {
		// The end of the stream may still fail it (a copy out of a
		// sandbox says how it ended after the archive).
		if _, err := io.Copy(io.Discard, r); err != nil {
			return fmt.Errorf("read the archive: %w", err)
		}
		if err := e.commit(); err != nil {
			return err
		}
	}
	return e.setDirModes()
}

// extractor is one extraction's state.
type extractor struct {
	root    *os.File
	o       Options
	total   int64
	dirs    []dirMode // made, whose modes and times are set last
	made    []string  // directories made, parents first (for a rollback)
	pending []staged  // written under temporary names (Atomic), in order
}

type dirMode struct {
	path  string
	mode  uint32
	mtime time.Time
}

// staged is a file or link written as tmp in directory dir (relative to the
// root, "." for it), to be renamed to name.
type staged struct{ dir, tmp, name string }

// entries extracts r's entries up to the end of the tar stream.
func (e *extractor) entries(r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the archive: %w", err)
		}
		comps, err := entryPath(hdr.Name, e.o.Top)
		if err != nil {
			return err
		}
		if comps == nil {
			continue // the stream's root, ".", is dir itself
		}
		name := strings.Join(comps, "/")
		parentRel := "."
		if len(comps) > 1 {
			parentRel = strings.Join(comps[:len(comps)-1], "/")
		}
		parent, err := e.openParents(comps[:len(comps)-1])
		if err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
		last := comps[len(comps)-1]
		switch hdr.Typeflag {
		case tar.TypeDir:
			var made bool
			made, err = makeDir(parent, last)
			if err == nil && made {
				e.made = append(e.made, name)
				e.dirs = append(e.dirs, dirMode{name, uint32(hdr.Mode) & 0o1777, hdr.ModTime})
			}
		case tar.TypeReg, tar.TypeRegA:
			if e.o.MaxBytes > 0 && e.total+hdr.Size > e.o.MaxBytes {
				err = fmt.Errorf("the files are over %d bytes: %w", e.o.MaxBytes, ErrTooLarge)
				break
			}
			e.total += hdr.Size
			err = e.writeFile(parent, parentRel, last, tr, hdr)
		case tar.TypeSymlink:
			err = e.symlink(parent, parentRel, last, hdr)
		default:
			err = fmt.Errorf("%s of type %q: only directories, regular files and symbolic links are copied: %w",
				name, hdr.Typeflag, errdefs.ErrInvalidArgument)
		}
		parent.Close()
		if err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
	}
}

// setDirModes sets the modes and times of the directories made, children
// before parents.
func (e *extractor) setDirModes() error {
	for i := len(e.dirs) - 1; i >= 0; i-- {
		d := e.dirs[i]
		f, err := OpenDir(e.root, d.path)
		if err == nil {
			err = unix.Fchmod(int(f.Fd()), d.mode)
			setTimes(f, "", d.mtime)
			f.Close()
		}
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

// openParents opens the directory comps names below the root, making the
// directories missing (mode 0755), and never following a link.
func (e *extractor) openParents(comps []string) (*os.File, error) {
	cur, err := openDir(e.root, ".")
	if err != nil {
		return nil, err
	}
	for i, c := range comps {
		next, err := openDir(cur, c)
		if errors.Is(err, unix.ENOENT) {
			err = unix.Mkdirat(int(cur.Fd()), c, 0o755)
			if err == nil {
				e.made = append(e.made, strings.Join(comps[:i+1], "/"))
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
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
