// Package atomicfile writes files atomically: to a temporary file of a
// unique name in the same directory, then renamed over the file, so that a
// reader sees the old content or the new, never a part, and writers at
// once never write into one another's temporary file (the last rename
// wins). Nothing is synced to disk: a crash may lose a write, not tear it.
package atomicfile

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
)

// WriteFile writes data to the file at path atomically and makes its mode
// perm (not masked by the umask). The temporary file is removed if a step
// fails.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return WriteFrom(path, bytes.NewReader(data), perm)
}

// WriteFrom writes what r reads, to its end, to the file at path
// atomically, as WriteFile does.
func WriteFrom(path string, r io.Reader, perm os.FileMode) (err error) {
	// Hidden, as a file being written: listings of the directory skip it.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	return err
}
