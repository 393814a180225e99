package snippet

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
)

// writeCode writes req's code to a file named req.File in a new directory
// of the snippets' working directory, both the snippets' user's, as a
// script of theirs would be (wire.Request.File), and returns its path and
// what removes the directory once the call has ended.
//
// The working directory (/tmp) is the snippets' to write: the directory is
// made under a new random name (mkdir fails on anything there already, a
// link included) and filled through its descriptor, opened without
// following links, before it is handed to the snippets' user.
func (a *Agent) writeCode(req *wire.Request) (path string, remove func(), err error) {
	var id [6]byte
	if _, err := unix.Getrandom(id[:], 0); err != nil {
		return "", nil, fmt.Errorf("write the code file: %w", err)
	}
	dir := filepath.Join(a.dir, ".flmbox-"+hex.EncodeToString(id[:]))
	path = filepath.Join(dir, req.File)
	if err := unix.Mkdir(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("write the code file %s: %w", path, err)
	}
	remove = func() { os.RemoveAll(dir) } // RemoveAll follows no link the snippet may have made
	if err := a.fillCodeDir(dir, req.File, req.Code); err != nil {
		remove()
		return "", nil, fmt.Errorf("write the code file %s: %w", path, err)
	}
	return path, remove, nil
}

// fillCodeDir writes code to file name in dir, which the agent has just
// made, and gives both to the snippets' user.
func (a *Agent) fillCodeDir(dir, name, code string) error {
	dfd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	_, werr := f.WriteString(code)
	if a.User != nil && werr == nil {
		werr = f.Chown(int(a.User.UID), int(a.User.GID))
	}
	if err := errors.Join(werr, f.Close()); err != nil {
		return err
	}
	if a.User != nil {
		return unix.Fchown(dfd, int(a.User.UID), int(a.User.GID))
	}
	return nil
}
