package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Unpacker applies OCI layer tar streams, bottom layer first, to one directory
// tree. It treats every layer as hostile:
//
//   - Parent directories are resolved inside the tree with chroot semantics
//     (openat2 RESOLVE_IN_ROOT): a symlink "etc -> /etc" makes "etc/x" land in
//     TREE/etc/x, never on the host. The final component of a path is never
//     followed (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW), so chmod, chown and utimes
//     never act through a symlink.
//   - Absolute entry names and names that climb out with ".." are confined to
//     the tree, as containerd does. Hardlink targets and whiteouts that climb
//     out are refused.
//   - An entry never changes the type of the tree's root.
//   - Device nodes and FIFOs are skipped with a warning: a sandbox gets its
//     /dev from the runtime, and a rootfs shared by sandboxes has no use for
//     host device nodes.
//   - Extended attributes (PAX SCHILY.xattr records) are not applied.
//   - The total uncompressed bytes and the number of entries are bounded
//     (UnpackOptions), against decompression bombs.
//
// Whiteouts follow the OCI image spec: ".wh.NAME" deletes NAME of lower
// layers, ".wh..wh..opq" hides every lower-layer entry of its directory;
// neither hides entries of its own layer. Other ".wh..wh." names (aufs
// metadata) are ignored. The last entry for a path wins; an existing path of
// another type is removed first, except a directory over a directory, which
// merges. Directory modes, owners and times are applied at the end of each
// layer, so that a read-only directory can still be filled.
//
// An Unpacker is not safe for concurrent use. The tree must not be modified by
// anyone else while it is being unpacked.
type Unpacker struct {
	root     int // O_PATH descriptor of the tree
	opts     UnpackOptions
	uid, gid int    // owner of the entries the process creates
	umask    uint32 // the process's umask (0o777 if unknown)

	// The cached descriptor of the last parent directory (see parent).
	dirFd     int
	dirPath   string
	dirSetgid bool
	dirty     bool // something was removed since dirFd was opened

	remaining int64 // bytes left in the MaxBytes budget
	entries   int64
	size      int64
	buf       []byte
}

// NewUnpacker opens dir, an existing directory, to unpack layers into.
func NewUnpacker(dir string, opts *UnpackOptions) (*Unpacker, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open unpack directory %s: %w", dir, err)
	}
	o := opts.withDefaults()
	return &Unpacker{root: fd, opts: o, remaining: o.MaxBytes,
		uid: os.Geteuid(), gid: os.Getegid(), umask: processUmask(), dirFd: -1}, nil
}

// Close releases the tree's descriptor.
func (u *Unpacker) Close() error {
	u.dropDir()
	if u.root < 0 {
		return nil
	}
	err := unix.Close(u.root)
	u.root = -1
	return err
}

// Size returns the bytes of regular-file content written so far, all layers
// together.
func (u *Unpacker) Size() int64 { return u.size }

// layerState is what one layer's application needs to remember.
type layerState struct {
	// added holds the paths of this layer's entries and all their ancestors:
	// whiteouts of this layer do not hide them.
	added map[string]bool
	// dirs holds the last directory header seen for each path, applied at the
	// end of the layer in first-seen order.
	dirs     map[string]meta
	dirOrder []string
}

func (ls *layerState) add(p string) {
	for !ls.added[p] {
		ls.added[p] = true
		if p == "" {
			return
		}
		p, _ = splitPath(p)
	}
}

// Apply reads one uncompressed layer tar stream from r and applies it to the
// tree. It reads r to EOF, past the end-of-archive marker, so that a caller
// hashing r sees every byte (the diff_id covers them all).
func (u *Unpacker) Apply(ctx context.Context, r io.Reader) error {
	lr := &limitReader{r: r, remaining: &u.remaining, limit: u.opts.MaxBytes}
	tr := tar.NewReader(lr)
	ls := &layerState{added: map[string]bool{}, dirs: map[string]meta{}}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if errors.Is(err, tar.ErrHeader) {
				return fmt.Errorf("read layer: not a tar stream (%w): %w", err, errdefs.ErrInvalidArgument)
			}
			return fmt.Errorf("read layer: %w", err)
		}
		u.entries++
		if u.entries > u.opts.MaxEntries {
			return &LimitError{What: "entries", Limit: u.opts.MaxEntries}
		}
		if err := u.applyEntry(tarContent{u, tr}, hdr, ls); err != nil {
			return fmt.Errorf("unpack %q: %w", hdr.Name, err)
		}
	}
	// Drain what follows the end-of-archive marker: it is part of the diff_id.
	if _, err := io.CopyBuffer(io.Discard, lr, u.buf); err != nil {
		return fmt.Errorf("read layer: %w", err)
	}
	return u.endLayer(ls)
}

// endLayer applies the metadata of the layer's directories.
func (u *Unpacker) endLayer(ls *layerState) error {
	u.dropDir()
	for _, p := range ls.dirOrder {
		if err := u.setDirMeta(p, ls.dirs[p]); err != nil {
			return fmt.Errorf("set metadata of directory %q: %w", p, err)
		}
	}
	return nil
}

// content makes a regular file entry's file, base in the directory open
// at pfd, with the entry's content and metadata.
type content interface {
	create(pfd int, base string, hdr *tar.Header) error
}

// tarContent writes the content that follows the entry's header in a
// layer's tar stream.
type tarContent struct {
	u *Unpacker
	r io.Reader
}

func (c tarContent) create(pfd int, base string, hdr *tar.Header) error {
	return c.u.writeFile(pfd, base, c.r, hdr)
}

func (u *Unpacker) applyEntry(src content, hdr *tar.Header, ls *layerState) error {
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		u.opts.Warnf("skipping %s %q: device nodes and FIFOs are not unpacked", typeName(hdr.Typeflag), hdr.Name)
		return nil
	}
	p, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := splitPath(p)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(hdr.Name, dir, base, ls)
	}
	if strings.Contains("/"+dir, "/"+whiteoutMeta) {
		return nil // inside aufs metadata (.wh..wh.plnk/…): ignored with it
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<32-2 || hdr.Gid > 1<<32-2 {
		return errUnsafe("owner %d:%d is out of range", hdr.Uid, hdr.Gid)
	}
	if p == "" {
		if hdr.Typeflag != tar.TypeDir {
			return errUnsafe("entry would replace the image root with a %s", typeName(hdr.Typeflag))
		}
		ls.setDir(p, hdr)
		return nil
	}

	var linkTarget string
	if hdr.Typeflag == tar.TypeLink {
		if linkTarget, err = cleanLinkTarget(hdr.Linkname); err != nil {
			return err
		}
		if linkTarget == p {
			return errUnsafe("hardlink points to itself")
		}
	}

	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeCont, tar.TypeLink:
	case tar.TypeSymlink:
		if hdr.Linkname == "" || len(hdr.Linkname) >= maxPathLen {
			return errUnsafe("symlink target of %d bytes", len(hdr.Linkname))
		}
	default:
		return errUnsafe("unsupported tar entry %s", typeName(hdr.Typeflag))
	}

	pfd, err := u.parent(dir, ls)
	if err != nil {
		return err
	}
	ls.add(p)

	// Create first and look at what is there only when something is: the
	// common case costs one system call.
	create := func() error {
		switch hdr.Typeflag {
		case tar.TypeDir:
			return unix.Mkdirat(pfd, base, 0o700)
		case tar.TypeSymlink:
			return unix.Symlinkat(hdr.Linkname, pfd, base)
		case tar.TypeLink:
			return u.hardlink(pfd, base, linkTarget)
		}
		return src.create(pfd, base, hdr)
	}
	err = create()
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if hdr.Typeflag == tar.TypeDir && unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = nil // directory over directory: merge
		} else {
			u.dirty = true
			if err := removeAllAt(pfd, base); err != nil {
				return fmt.Errorf("replace existing entry: %w", err)
			}
			err = create()
		}
	}
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		ls.setDir(p, hdr)
	case tar.TypeSymlink:
		if u.needChown(hdr) {
			if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("chown: %w", err)
			}
		}
		return setTimesAt(pfd, base, metaOf(hdr))
	}
	return nil
}

// parent returns a descriptor of directory dir of the tree, creating it if
// needed. The descriptor is cached for the next entries in the same
// directory, and owned by the Unpacker. The cache holds a descriptor, never a
// resolved path, and is dropped after anything was removed from the tree
// (the only way a directory's path can come to lead elsewhere).
func (u *Unpacker) parent(dir string, ls *layerState) (int, error) {
	if u.dirFd >= 0 && !u.dirty && u.dirPath == dir {
		return u.dirFd, nil
	}
	u.dropDir()
	fd, err := u.mkdirAll(dir, ls)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	u.dirFd, u.dirPath, u.dirSetgid = fd, dir, st.Mode&unix.S_ISGID != 0
	return fd, nil
}

func (u *Unpacker) dropDir() {
	if u.dirFd >= 0 {
		unix.Close(u.dirFd)
	}
	u.dirFd, u.dirPath, u.dirty = -1, "", false
}

// needChown reports whether an entry created in the cached parent directory
// needs a chown to get hdr's owner: new entries belong to the process's
// user and to its group, or to the directory's group if it is setgid.
func (u *Unpacker) needChown(hdr *tar.Header) bool {
	return !u.opts.IgnoreOwner && (hdr.Uid != u.uid || hdr.Gid != u.gid || u.dirSetgid)
}

// setDir remembers a directory's metadata (not its header: PAX records of
// up to 1 MiB each would pile up) for the end of the layer.
func (ls *layerState) setDir(p string, hdr *tar.Header) {
	if _, ok := ls.dirs[p]; !ok {
		ls.dirOrder = append(ls.dirOrder, p)
	}
	ls.dirs[p] = metaOf(hdr)
}

// growBuf makes the copy buffer fit a file of size bytes: 32 KiB, or 1 MiB
// once a file is larger, so that a layer of small files does not pay for
// clearing a large buffer.
func (u *Unpacker) growBuf(size int64) {
	n := 32 << 10
	if size > int64(n) {
		n = 1 << 20
	}
	if len(u.buf) < n {
		u.buf = make([]byte, n)
	}
}

func (u *Unpacker) writeFile(pfd int, base string, tr io.Reader, hdr *tar.Header) error {
	// Sparse entries expand holes without reading the stream, so the bytes
	// written are bounded on their own.
	if hdr.Size > u.opts.MaxBytes-u.size {
		return &LimitError{What: "uncompressed bytes", Limit: u.opts.MaxBytes}
	}
	mode := uint32(hdr.Mode & 0o7777)
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode&0o777)
	if err != nil {
		return fmt.Errorf("create file: %w", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	u.growBuf(hdr.Size)
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, io.LimitReader(tr, hdr.Size), u.buf)
	u.size += n
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	if n != hdr.Size {
		return fmt.Errorf("write file: %w", io.ErrUnexpectedEOF)
	}
	chown := u.needChown(hdr)
	if chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	// After chown, which clears setuid and setgid; and when the umask took
	// bits away at creation.
	if chown || mode&0o7000 != 0 || mode&u.umask != 0 {
		if err := unix.Fchmod(fd, mode); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := setTimesAt(pfd, base, metaOf(hdr)); err != nil {
		return err
	}
	return f.Close()
}

func (u *Unpacker) hardlink(pfd int, base, target string) error {
	tdir, tbase := splitPath(target)
	tfd, err := u.openDir(tdir, unix.O_PATH)
	if err != nil {
		return errUnsafe("hardlink target %q does not exist: a hardlink must name an earlier entry", target)
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errUnsafe("hardlink target %q does not exist: a hardlink must name an earlier entry", target)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return errUnsafe("hardlink target %q is a directory", target)
	}
	// Flags 0: a symlink target is linked itself, never followed.
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hardlink to %q: %w", target, err)
	}
	return nil
}

func (u *Unpacker) whiteout(name, dir, base string, ls *layerState) error {
	if raw := path.Clean(strings.TrimLeft(name, "/")); raw == ".." || strings.HasPrefix(raw, "../") {
		return errUnsafe("whiteout climbs out of the image")
	}
	if base == whiteoutOpaque {
		return u.opaque(dir, ls)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		u.opts.Warnf("ignoring aufs metadata entry %q", name)
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return errUnsafe("invalid whiteout name %q", base)
	}
	p := path.Join(dir, target)
	pfd, err := u.openDir(dir, unix.O_PATH)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil // nothing there to hide
	}
	if err != nil {
		return fmt.Errorf("resolve %q: %w", dir, err)
	}
	defer unix.Close(pfd)
	if ls.added[p] {
		// A whiteout never hides entries of its own layer. If this layer
		// put entries into a lower directory, hide only the lower ones.
		fd, err := unix.Openat(pfd, target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil // this layer's own non-directory: kept
		}
		u.dirty = true
		return clearLower(fd, p, ls)
	}
	u.dirty = true
	if err := removeAllAt(pfd, target); err != nil {
		return fmt.Errorf("whiteout %q: %w", p, err)
	}
	return nil
}

// opaque hides every entry of dir that lower layers put there.
func (u *Unpacker) opaque(dir string, ls *layerState) error {
	fd, err := u.openDir(dir, unix.O_RDONLY)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("resolve %q: %w", dir, err)
	}
	ls.add(dir)
	u.dirty = true
	return clearLower(fd, dir, ls)
}

// clearLower removes the entries of the directory open at fd (path dir) that
// this layer did not add, and recurses into the directories it did add. It
// closes fd.
func clearLower(fd int, dir string, ls *layerState) error {
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("list %q: %w", dir, err)
	}
	for _, name := range names {
		p := path.Join(dir, name)
		if !ls.added[p] {
			if err := removeAllAt(fd, name); err != nil {
				return fmt.Errorf("hide %q: %w", p, err)
			}
			continue
		}
		cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // not a directory: this layer's own file stays
		}
		if err := clearLower(cfd, p, ls); err != nil {
			return err
		}
	}
	return nil
}

// setDirMeta applies a directory entry's owner, mode and times, unless the
// path is no longer a directory (a later entry of the layer replaced it).
func (u *Unpacker) setDirMeta(p string, m meta) error {
	dir, base := splitPath(p)
	if p == "" {
		dir, base = "", "."
	}
	pfd, err := u.openDir(dir, unix.O_PATH)
	if err != nil {
		return nil
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	if !u.opts.IgnoreOwner {
		if err := unix.Fchown(fd, m.uid, m.gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmod(fd, uint32(m.mode&0o7777)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return setTimesAt(pfd, base, m)
}

// setTimesAt sets the access and modification times of base in pfd without
// following a symlink.
func setTimesAt(pfd int, base string, m meta) error {
	ts := []unix.Timespec{timespec(m.atime), timespec(m.mtime)}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// meta is the metadata of an entry that is applied to the tree.
type meta struct {
	mode         int64
	uid, gid     int
	atime, mtime time.Time
}

func metaOf(hdr *tar.Header) meta {
	m := meta{mode: hdr.Mode, uid: hdr.Uid, gid: hdr.Gid, mtime: clampTime(hdr.ModTime)}
	m.atime = m.mtime
	if !hdr.AccessTime.IsZero() {
		m.atime = clampTime(hdr.AccessTime)
	}
	return m
}

// timespec converts t without going through UnixNano, which overflows after
// the year 2262.
func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// openDir resolves p (relative to the tree's root, "" for the root) inside
// the tree with chroot semantics and opens it as a directory with flags
// (O_PATH or O_RDONLY).
func (u *Unpacker) openDir(p string, flags uint64) (int, error) {
	return openDirIn(u.root, p, flags)
}

// mkdirAll opens directory p inside the tree, creating it and its missing
// parents (mode 0755) first; the created directories count as this layer's.
func (u *Unpacker) mkdirAll(p string, ls *layerState) (int, error) {
	fd, err := u.openDir(p, unix.O_PATH)
	if err == nil {
		return fd, nil
	}
	if !errors.Is(err, unix.ENOENT) || p == "" {
		if errors.Is(err, unix.ENOTDIR) {
			return -1, errUnsafe("parent %q is not a directory", p)
		}
		return -1, fmt.Errorf("resolve parent %q: %w", p, err)
	}
	parent, base := splitPath(p)
	pfd, err := u.mkdirAll(parent, ls)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	// Implicit directories count as entries: a few deep names must not
	// create unbounded numbers of inodes.
	u.entries++
	if u.entries > u.opts.MaxEntries {
		return -1, &LimitError{What: "entries", Limit: u.opts.MaxEntries}
	}
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil && err != unix.EEXIST {
		return -1, fmt.Errorf("mkdir parent %q: %w", p, err)
	}
	ls.add(p)
	fd, err = u.openDir(p, unix.O_PATH)
	if err != nil {
		// EEXIST above and still unresolvable: a dangling symlink or a file.
		return -1, errUnsafe("parent %q is not a directory", p)
	}
	return fd, nil
}

// removeAllAt removes name in the directory open at dirfd, recursively,
// never following symlinks.
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err != nil {
		f.Close()
		return err
	}
	for _, n := range names {
		if err := removeAllAt(fd, n); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// splitPath splits a cleaned relative path into its parent ("" for the root)
// and its last component.
func splitPath(p string) (dir, base string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p
	}
	return p[:i], p[i+1:]
}

// processUmask reads the umask from /proc/self/status (reading it with
// umask(2) would change it for a moment for every thread). If it cannot be
// read, every bit counts as masked, so that modes are always set explicitly.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o777
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return uint32(m)
			}
		}
	}
	return 0o777
}
