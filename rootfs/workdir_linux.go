package rootfs

import (
	"fmt"
	"path"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Enterable says whether dir, an absolute path in tree (resolved in it as
// a layer's paths are: its symlinks lead inside the tree), is a directory
// that the user uid:gid (with no other groups) may search and list, every
// directory on the way searchable: nil if so, else why not
// (errdefs.ErrFailedPrecondition).
func Enterable(tree, dir string, uid, gid uint32) error {
	if !path.IsAbs(dir) {
		return fmt.Errorf("%s is not an absolute path: %w", dir, errdefs.ErrFailedPrecondition)
	}
	root, err := unix.Open(tree, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open tree %s: %w", tree, err)
	}
	defer unix.Close(root)
	p := path.Clean(dir)[1:]
	for prefix := p; ; prefix = path.Dir(prefix) {
		if prefix == "." {
			prefix = ""
		}
		fd, err := openDirIn(root, prefix, unix.O_PATH)
		if err != nil {
			return fmt.Errorf("%s: %w: %w", "/"+prefix, err, errdefs.ErrFailedPrecondition)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%s: %w", "/"+prefix, err)
		}
		want := uint32(1) // search
		if prefix == p {
			want |= 4 // and list
		}
		bits := st.Mode & 0o7
		switch {
		case st.Uid == uid:
			bits = st.Mode >> 6 & 0o7
		case st.Gid == gid:
			bits = st.Mode >> 3 & 0o7
		}
		if bits&want != want {
			return fmt.Errorf("%s (mode %o, owner %d:%d) is closed to the user %d:%d: %w", "/"+prefix, st.Mode&0o7777, st.Uid, st.Gid, uid, gid, errdefs.ErrFailedPrecondition)
		}
		if prefix == "" {
			return nil
		}
	}
}
