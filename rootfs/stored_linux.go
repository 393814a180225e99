package rootfs

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A stored layer is a layer unpacked once, on its own, so that every image
// that has it shares its files: its directory holds
//
//	index     the layer's entries in the order of its tar stream (a gob
//	          stream of storedEntry), every field that unpacking applies
//	files/N   the content of regular-file entry N (from 1), with the
//	          entry's mode, owner and times
//	tar-size  the bytes of the layer's tar stream, which count against
//	          UnpackOptions.MaxBytes as the stream's own would
//
// An image's tree is made by applying its stored layers in order, as Apply
// applies tar streams, each regular file a hard link to its stored file
// (Unpacker.ApplyStored): the same checks, the same whiteouts, the same
// tree, with the content on the disk once. The names of a layer never
// become paths in the layer's directory: its files are numbered.

// Names in a stored layer's directory.
const (
	storedIndex   = "index"
	storedFiles   = "files"
	storedTarSize = "tar-size"
)

// storedEntry is one entry of a stored layer's index.
type storedEntry struct {
	Typeflag            byte
	Name, Linkname      string
	Mode                int64
	UID, GID            int
	ModTime, AccessTime time.Time
	Size                int64
	// File is N of files/N for a regular file's content, 0 for none.
	File int64
}

func (e *storedEntry) header() *tar.Header {
	return &tar.Header{Typeflag: e.Typeflag, Name: e.Name, Linkname: e.Linkname, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
		ModTime: e.ModTime, AccessTime: e.AccessTime, Size: e.Size}
}

// hasContent reports whether applyEntry makes a file with content for an
// entry of type t.
func hasContent(t byte) bool {
	switch t {
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeCont:
		return true
	}
	return false
}

// storeLayer reads one uncompressed layer tar stream from r to its end and
// stores it in dir, an empty directory: its index and its regular files'
// content with their metadata. The entries are checked when the layer is
// applied (ApplyStored); here only the bytes and entries are bounded
// (opts). It returns the bytes of content stored.
func storeLayer(ctx context.Context, r io.Reader, dir string, opts *UnpackOptions) (int64, error) {
	o := opts.withDefaults()
	files := filepath.Join(dir, storedFiles)
	if err := os.Mkdir(files, 0o700); err != nil {
		return 0, err
	}
	ffd, err := unix.Open(files, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", files, err)
	}
	defer unix.Close(ffd)
	idx, err := os.OpenFile(filepath.Join(dir, storedIndex), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer idx.Close()
	bw := bufio.NewWriterSize(idx, 64<<10)
	enc := gob.NewEncoder(bw)
	// The files' directory is the process's own: writeFile chowns and
	// chmods as it would in a tree.
	u := &Unpacker{root: -1, opts: o, remaining: o.MaxBytes, uid: os.Geteuid(), gid: os.Getegid(), umask: processUmask(), dirFd: -1}
	lr := &limitReader{r: r, remaining: &u.remaining, limit: o.MaxBytes}
	tr := tar.NewReader(lr)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if errors.Is(err, tar.ErrHeader) {
				return 0, fmt.Errorf("read layer: not a tar stream (%w): %w", err, errdefs.ErrInvalidArgument)
			}
			return 0, fmt.Errorf("read layer: %w", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		u.entries++
		if u.entries > o.MaxEntries {
			return 0, &LimitError{What: "entries", Limit: o.MaxEntries}
		}
		e := storedEntry{Typeflag: hdr.Typeflag, Name: hdr.Name, Linkname: hdr.Linkname, Mode: hdr.Mode, UID: hdr.Uid, GID: hdr.Gid,
			ModTime: hdr.ModTime, AccessTime: hdr.AccessTime, Size: hdr.Size}
		if hasContent(hdr.Typeflag) {
			if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<32-2 || hdr.Gid > 1<<32-2 {
				return 0, fmt.Errorf("unpack %q: %w", hdr.Name, errUnsafe("owner %d:%d is out of range", hdr.Uid, hdr.Gid))
			}
			n++
			e.File = n
			if err := u.writeFile(ffd, strconv.FormatInt(n, 10), tr, hdr); err != nil {
				return 0, fmt.Errorf("unpack %q: %w", hdr.Name, err)
			}
		}
		if err := enc.Encode(&e); err != nil {
			return 0, fmt.Errorf("write the layer's index: %w", err)
		}
	}
	// Drain what follows the end-of-archive marker: it is part of the diff_id.
	if _, err := io.CopyBuffer(io.Discard, lr, u.buf); err != nil {
		return 0, fmt.Errorf("read layer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("write the layer's index: %w", err)
	}
	tarSize := strconv.FormatInt(o.MaxBytes-u.remaining, 10)
	if err := os.WriteFile(filepath.Join(dir, storedTarSize), []byte(tarSize), 0o600); err != nil {
		return 0, err
	}
	return u.size, idx.Close()
}

// ApplyStored applies the layer stored in dir (storeLayer) to the tree, as
// Apply applies the layer's tar stream, each regular file a hard link to
// its stored file: a copy where that file has as many links as the file
// system allows.
func (u *Unpacker) ApplyStored(ctx context.Context, dir string) error {
	f, err := os.Open(filepath.Join(dir, storedIndex))
	if err != nil {
		return fmt.Errorf("open stored layer: %w", err)
	}
	defer f.Close()
	ffd, err := unix.Open(filepath.Join(dir, storedFiles), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open stored layer: %w", err)
	}
	defer unix.Close(ffd)
	b, err := os.ReadFile(filepath.Join(dir, storedTarSize))
	if err != nil {
		return fmt.Errorf("open stored layer: %w", err)
	}
	tarSize, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("read stored layer %s: %w", dir, err)
	}
	if tarSize > u.remaining {
		return &LimitError{What: "uncompressed bytes", Limit: u.opts.MaxBytes}
	}
	u.remaining -= tarSize
	dec := gob.NewDecoder(bufio.NewReaderSize(f, 64<<10))
	ls := &layerState{added: map[string]bool{}, dirs: map[string]meta{}}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var e storedEntry
		if err := dec.Decode(&e); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("read stored layer %s: %w", dir, err)
		}
		u.entries++
		if u.entries > u.opts.MaxEntries {
			return &LimitError{What: "entries", Limit: u.opts.MaxEntries}
		}
		if err := u.applyEntry(&storedContent{u: u, files: ffd, file: e.File}, e.header(), ls); err != nil {
			return fmt.Errorf("unpack %q: %w", e.Name, err)
		}
	}
	return u.endLayer(ls)
}

// storedContent makes a regular file a hard link to its stored file.
type storedContent struct {
	u     *Unpacker
	files int // O_PATH descriptor of the stored layer's files
	file  int64
}

func (c *storedContent) create(pfd int, base string, hdr *tar.Header) error {
	u := c.u
	if hdr.Size > u.opts.MaxBytes-u.size {
		return &LimitError{What: "uncompressed bytes", Limit: u.opts.MaxBytes}
	}
	name := strconv.FormatInt(c.file, 10)
	err := unix.Linkat(c.files, name, pfd, base, 0)
	if errors.Is(err, unix.EMLINK) {
		fd, err := unix.Openat(c.files, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open stored file: %w", err)
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		return u.writeFile(pfd, base, f, hdr)
	}
	if err != nil {
		return fmt.Errorf("link stored file: %w", err)
	}
	u.size += hdr.Size
	return nil
}
