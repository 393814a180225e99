package snippet

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
)

// writeCode writes req's code to a file named req.File in a new directory
// of the snippets' working directory, as the snippets' user (asUser): a
// script of theirs (wire.Request.File). It returns the file's path and what
// removes the directory once the call has ended.
func (a *Agent) writeCode(req *wire.Request) (path string, remove func(), err error) {
	var id [6]byte
	if _, err := unix.Getrandom(id[:], 0); err != nil {
		return "", nil, fmt.Errorf("write the code file: %w", err)
	}
	dir := filepath.Join(a.dir, ".flmbox-"+hex.EncodeToString(id[:]))
	path = filepath.Join(dir, req.File)
	err = asUser(a.User, func() error {
		if err := unix.Mkdir(dir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(req.Code), 0o644); err != nil {
			os.RemoveAll(dir)
			return err
		}
		return nil
	})
	if err != nil {
		return "", nil, fmt.Errorf("write the code file %s: %w", path, err)
	}
	// RemoveAll follows no link the snippet may have made, and the agent's
	// user may remove what the snippets' left there.
	return path, func() { os.RemoveAll(dir) }, nil
}
