package snippet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/safetar"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Copies (wire.Copy, flmbox cp) run in a helper process: the agent's own
// program started with HelperArg and "copy-in" or "copy-out", as the
// snippets' user (User), so that a copy can reach nothing a snippet could
// not; and internal/safetar never follows a link, so that a link a snippet
// planted under /tmp between two calls leads a copy nowhere. Into the
// sandbox, only paths under Dir (/tmp) are taken.

// copyHelperGrace bounds the wait for a copy helper to exit once its
// stream has ended.
const copyHelperGrace = 10 * time.Second

// copy answers a Copy request on conn, whose stream follows the request.
func (a *Agent) copy(ctx context.Context, c *wire.Copy, conn net.Conn) *wire.Result {
	// As a call: a reset waits for it (nothing is copied into a sandbox
	// after its reset), and no sweep of strays kills its helper.
	a.calls.RLock()
	defer a.calls.RUnlock()
	res := &wire.Result{Version: wire.ProtocolVersion, Copied: &wire.CopyStats{}}
	fail := func(err error) *wire.Result {
		res.ExitCode, res.Error = -1, err.Error()
		return res
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(fmt.Errorf("copy: %w", err))
	}
	args := []string{"flmbox-agent", HelperArg}
	switch c.Op {
	case wire.CopyIn:
		if c.Path != a.dir && !strings.HasPrefix(c.Path, a.dir+"/") {
			return fail(fmt.Errorf("copy into %s: only paths under %s can be written", c.Path, a.dir))
		}
		args = append(args, "copy-in", a.dir, c.Path, strconv.FormatBool(c.Into), strconv.FormatInt(c.Limit(), 10))
	case wire.CopyOut:
		if c.Path == "/" {
			return fail(fmt.Errorf("copy out of /: name a directory or file under it"))
		}
		args = append(args, "copy-out", c.Path, strconv.FormatInt(c.Limit(), 10))
	}
	var stderr bytes.Buffer
	cmd := &exec.Cmd{Path: exe, Args: args, Dir: "/", Env: []string{}, Stderr: &limitedBuffer{buf: &stderr, n: 4096}}
	if cred := a.User.credential(); cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	counter := &countWriter{}
	var streamErr error
	if c.Op == wire.CopyIn {
		in, err := cmd.StdinPipe()
		if err != nil {
			return fail(fmt.Errorf("copy: %w", err))
		}
		if err := cmd.Start(); err != nil {
			return fail(fmt.Errorf("copy: start its helper: %w", err))
		}
		conn.SetReadDeadline(time.Now().Add(wire.CopyTimeout))
		streamErr = wire.ReadFrames(bufio.NewReaderSize(conn, 64<<10), io.MultiWriter(in, counter))
		in.Close()
	} else {
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail(fmt.Errorf("copy: %w", err))
		}
		if err := cmd.Start(); err != nil {
			return fail(fmt.Errorf("copy: start its helper: %w", err))
		}
		conn.SetWriteDeadline(time.Now().Add(wire.CopyTimeout))
		streamErr = wire.WriteFrames(conn, io.TeeReader(out, counter))
	}
	if streamErr != nil {
		cmd.Process.Kill()
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-time.After(copyHelperGrace):
		cmd.Process.Kill()
		waitErr = <-done
	case <-ctx.Done():
		cmd.Process.Kill()
		waitErr = <-done
	}
	res.Copied.Bytes = counter.n
	if msg := strings.TrimSpace(stderr.String()); waitErr != nil && msg != "" {
		return fail(errors.New(msg))
	}
	if streamErr != nil {
		return fail(fmt.Errorf("copy: %w", streamErr))
	}
	if waitErr != nil {
		return fail(fmt.Errorf("copy: %w", waitErr))
	}
	return res
}

// copyHelper runs a copy in the helper process: "copy-in ROOT PATH INTO
// MAX" extracts the tar stream on stdin; "copy-out PATH MAX" writes PATH's
// stream to stdout.
func copyHelper(args []string) error {
	switch {
	case len(args) == 5 && args[0] == "copy-in":
		max, err := strconv.ParseInt(args[4], 10, 64)
		if err != nil {
			return err
		}
		return copyIn(args[1], args[2], args[3] == "true", max, os.Stdin)
	case len(args) == 3 && args[0] == "copy-out":
		max, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return err
		}
		p := args[1]
		return safetar.Archive(os.Stdout, p, filepath.Base(p), max)
	}
	return fmt.Errorf("copy helper: want copy-in ROOT PATH INTO MAX or copy-out PATH MAX, got %q", args)
}

// copyIn extracts r at p, under root: into p if p is a directory (or if
// into: then it must be one), else as p (the stream's top-level entry
// renamed), in p's directory. No link is followed below root.
func copyIn(root, p string, into bool, max int64, r io.Reader) error {
	rootDir, err := os.Open(root)
	if err != nil {
		return fmt.Errorf("copy into %s: %w", p, err)
	}
	defer rootDir.Close()
	rel, err := filepath.Rel(root, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("copy into %s: not under %s", p, root)
	}
	if rel == "." {
		return safetar.Extract(rootDir, r, safetar.Options{MaxBytes: max})
	}
	parent, err := safetar.OpenDir(rootDir, filepath.Dir(rel))
	if err != nil {
		return fmt.Errorf("copy into %s: %w", p, err)
	}
	defer parent.Close()
	base := filepath.Base(rel)
	var st unix.Stat_t
	err = unix.Fstatat(int(parent.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW)
	isDir := err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if into && !isDir {
		return fmt.Errorf("copy into %s: not a directory", p)
	}
	if isDir {
		dir, err := safetar.OpenDir(parent, base)
		if err != nil {
			return fmt.Errorf("copy into %s: %w", p, err)
		}
		defer dir.Close()
		return safetar.Extract(dir, r, safetar.Options{MaxBytes: max})
	}
	return safetar.Extract(parent, r, safetar.Options{MaxBytes: max, Top: base})
}

// countWriter counts what is written through it.
type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// limitedBuffer keeps the first n bytes written to it.
type limitedBuffer struct {
	buf *bytes.Buffer
	n   int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.n - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
