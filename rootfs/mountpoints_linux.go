package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// preparedPoints is what prepareMountPoints did.
type preparedPoints struct {
	done    []MountPoint // made or found with their type
	skipped []MountPoint // optional, found with another type
	moved   []Moved      // optional, found as a symlink, made at its target
	added   []string     // paths created, resolved in the tree, parents first
}

// prepareMountPoints makes points (checked, parents first) in tree, after
// its last layer. Paths are resolved as the unpacker resolves a layer's
// parents: inside the tree with chroot semantics (openat2 RESOLVE_IN_ROOT),
// so a symlink of the image leads inside the tree, never to the host; the
// last component is never followed. A mount point that exists with its
// type is kept as it is. Every point is checked before anything is made, so
// that one the image has with another type (a symlink included) changes
// nothing: it fails with errdefs.ErrFailedPrecondition, naming the path,
// unless it is Optional, which is skipped.
//
// New directories get mode 0755, new files 0644, both empty and owned by
// the process. The directories they are made in keep their access and
// modification times. What it made is returned also on failure.
func prepareMountPoints(tree string, points []MountPoint) (p preparedPoints, err error) {
	root, err := unix.Open(tree, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return p, fmt.Errorf("open tree %s: %w", tree, err)
	}
	defer unix.Close(root)
	var todo []MountPoint
	for _, mp := range points {
		if _, err := walkMountPoint(root, mp, false); err != nil {
			if mp.Optional && errors.Is(err, errdefs.ErrFailedPrecondition) {
				if to, ok := linkTarget(root, mp); ok {
					p.moved = append(p.moved, Moved{MountPoint: mp, To: to})
					todo = append(todo, MountPoint{Path: to, Type: mp.Type})
					continue
				}
				p.skipped = append(p.skipped, mp)
				continue
			}
			return preparedPoints{}, err
		}
		todo = append(todo, mp)
	}
	for _, mp := range todo {
		a, err := walkMountPoint(root, mp, true)
		p.added = append(p.added, a...)
		if err != nil {
			return p, err
		}
		p.done = append(p.done, mp)
	}
	return p, nil
}

// walkMountPoint resolves mp in the tree open at root, component by
// component, and checks what it finds. With create, it makes what is
// missing and returns the paths it made; without, it stops at the first
// missing component.
func walkMountPoint(root int, mp MountPoint, create bool) (added []string, err error) {
	parts := strings.Split(mp.Path[1:], "/")
	dir, err := unix.Openat(root, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer func() { unix.Close(dir) }()
	for i, name := range parts {
		last := i == len(parts)-1
		here := "/" + strings.Join(parts[:i+1], "/") // as named, for messages
		var st unix.Stat_t
		err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			if !create {
				return nil, nil // the rest is made in the second pass
			}
			next, err := makeEntry(dir, name, last && mp.Type == MountPointFile)
			if err != nil {
				return added, fmt.Errorf("mount point %s: create %s: %w", mp.Path, here, err)
			}
			added = append(added, resolvedPath(root, dir, name, here))
			if last {
				if next >= 0 {
					unix.Close(next)
				}
				return added, nil
			}
			unix.Close(dir)
			dir = next
			continue
		}
		if err != nil {
			return added, fmt.Errorf("mount point %s: inspect %s: %w", mp.Path, here, err)
		}
		typ := st.Mode & unix.S_IFMT
		if last {
			want := uint32(unix.S_IFDIR)
			if mp.Type == MountPointFile {
				want = unix.S_IFREG
			}
			if typ != want {
				return added, wrongType(mp, here, typ)
			}
			return added, nil
		}
		var next int
		switch typ {
		case unix.S_IFDIR:
			next, err = unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		case unix.S_IFLNK:
			// Followed inside the tree, from its root, as a layer's parent
			// directories are.
			next, err = openDirIn(root, strings.Join(parts[:i+1], "/"), unix.O_PATH)
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				return added, fmt.Errorf("mount point %s: the image's symlink %s does not lead to a directory in the image: %w", mp.Path, here, errdefs.ErrFailedPrecondition)
			}
		default:
			return added, wrongType(mp, here, typ)
		}
		if err != nil {
			return added, fmt.Errorf("mount point %s: open %s: %w", mp.Path, here, err)
		}
		unix.Close(dir)
		dir = next
	}
	return added, nil
}

// linkTarget returns where the image's symlink at mp's path leads, an
// absolute path of the tree, if mp can be made there instead: the link's
// parent resolves in the tree, its target (relative to the link's
// directory as resolved, or absolute) is a valid mount point path outside
// the runtime's own mounts (runtimeDirs), and mp's type or nothing is
// there, nor a symlink on the way that leads out of the tree's
// directories.
func linkTarget(root int, mp MountPoint) (string, bool) {
	dir, base := path.Split(mp.Path)
	pfd, err := openDirIn(root, strings.Trim(dir, "/"), unix.O_PATH)
	if err != nil {
		return "", false
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return "", false
	}
	buf := make([]byte, maxPathLen)
	n, err := unix.Readlinkat(pfd, base, buf)
	if err != nil || n == 0 || n >= len(buf) {
		return "", false
	}
	target := string(buf[:n])
	if !path.IsAbs(target) {
		target = path.Join(path.Dir(resolvedPath(root, pfd, base, mp.Path)), target)
	}
	to := MountPoint{Path: path.Clean("/" + target), Type: mp.Type}
	if checkMountPoint(to) != nil || to.Path == mp.Path {
		return "", false
	}
	for _, d := range runtimeDirs {
		if to.Path == d || strings.HasPrefix(to.Path, d+"/") {
			return "", false
		}
	}
	if _, err := walkMountPoint(root, to, false); err != nil {
		return "", false
	}
	return to.Path, true
}

// makeEntry makes an empty file or a directory name in dir (mode 0644 or
// 0755 whatever the umask), keeping dir's access and modification times,
// and returns an O_PATH descriptor of the new directory (-1 for a file).
func makeEntry(dir int, name string, file bool) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		return -1, err
	}
	var fd int
	var err error
	if file {
		fd, err = unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err == nil {
			err = unix.Fchmod(fd, 0o644)
		}
	} else if err = unix.Mkdirat(dir, name, 0o755); err == nil {
		fd, err = unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Fchmod(fd, 0o755)
		}
	}
	if err == nil {
		// "." is dir itself: never a symlink.
		ts := []unix.Timespec{st.Atim, st.Mtim}
		err = unix.UtimesNanoAt(dir, ".", ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	if file && err == nil {
		err = unix.Close(fd)
		fd = -1
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, err
	}
	return fd, nil
}

// resolvedPath is the path in the tree of name in dir, "/dev/.flmbox" when
// an image's symlinks led there, from the kernel's names of both
// descriptors; named if they cannot be read.
func resolvedPath(root, dir int, name, named string) string {
	r, err1 := os.Readlink("/proc/self/fd/" + strconv.Itoa(root))
	d, err2 := os.Readlink("/proc/self/fd/" + strconv.Itoa(dir))
	if err1 != nil || err2 != nil {
		return named
	}
	if d == r {
		return "/" + name
	}
	rel, ok := strings.CutPrefix(d, strings.TrimSuffix(r, "/")+"/")
	if !ok {
		return named
	}
	return path.Join("/", rel, name)
}

func wrongType(mp MountPoint, here string, typ uint32) error {
	want := "a directory"
	if here == mp.Path && mp.Type == MountPointFile {
		want = "a regular file"
	}
	return fmt.Errorf("mount point %s: the image has %s at %s, where it needs %s: %w",
		mp.Path, fileType(typ), here, want, errdefs.ErrFailedPrecondition)
}

// fileType names a stat(2) file type with its article.
func fileType(typ uint32) string {
	switch typ {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device node"
	}
	return fmt.Sprintf("a file of type %#o", typ)
}

// openDirIn resolves p (relative to the tree open at root, "" for the root)
// inside the tree with chroot semantics and opens it as a directory with
// flags (O_PATH or O_RDONLY).
func openDirIn(root int, p string, flags uint64) (int, error) {
	if p == "" {
		p = "."
	}
	how := unix.OpenHow{
		Flags:   flags | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for {
		fd, err := unix.Openat2(root, p, &how)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
}
