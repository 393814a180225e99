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

	"github.com/containerd/errdefs"
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

// copy answers a Copy request on conn, whose stream follows the request
// (rest: what was read of it already).
func (a *Agent) copy(ctx context.Context, c *wire.Copy, conn net.Conn, rest []byte) *wire.Result {
	// As a call: a reset waits for it (nothing is copied into a sandbox
	// after its reset), and no sweep of strays kills its helper.
	a.calls.RLock()
	defer a.calls.RUnlock()
	if stale := a.staleResult(c.HandOut); stale != nil {
		return stale
	}
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
	// The helper reads or writes the stream on the connection itself (fd
	// 3): a copy through the agent would cost a pipe and a process switch
	// per chunk. What the agent read past the request comes first, through
	// a pipe (fd 4); the helper writes the stream's size on its stdout.
	connFile, err := fileOf(conn)
	if err != nil {
		return fail(fmt.Errorf("copy: %w", err))
	}
	defer connFile.Close()
	restR, restW, err := os.Pipe()
	if err != nil {
		return fail(fmt.Errorf("copy: %w", err))
	}
	var stderr, stdout bytes.Buffer
	cmd := &exec.Cmd{Path: exe, Args: args, Dir: "/", Env: []string{}, ExtraFiles: []*os.File{connFile, restR},
		Stdout: &limitedBuffer{buf: &stdout, n: 64}, Stderr: &limitedBuffer{buf: &stderr, n: 4096}}
	if cred := a.User.credential(); cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	pid, err := startChild(cmd) // registered: the reaper leaves it to Wait
	restR.Close()
	if err != nil {
		restW.Close()
		return fail(fmt.Errorf("copy: start its helper: %w", err))
	}
	restW.Write(rest) // at most the request's buffer: within the pipe's
	restW.Close()
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		forgetChild(pid)
		done <- err
	}()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-time.After(wire.CopyTimeout):
		cmd.Process.Kill()
		waitErr = <-done
	case <-ctx.Done():
		cmd.Process.Kill()
		waitErr = <-done
	}
	// The helper's stdout: "BYTES [KIND]".
	if f := strings.Fields(stdout.String()); len(f) > 0 {
		res.Copied.Bytes, _ = strconv.ParseInt(f[0], 10, 64)
		if len(f) > 1 && waitErr != nil {
			res.Copied.Kind = f[1]
		}
	}
	if msg := strings.TrimSpace(stderr.String()); waitErr != nil && msg != "" {
		return fail(errors.New(msg))
	}
	if waitErr != nil {
		return fail(fmt.Errorf("copy: %w", waitErr))
	}
	return res
}

// fileOf returns a duplicate of conn's socket, blocking.
func fileOf(conn net.Conn) (*os.File, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("a connection of type %T", conn)
	}
	return uc.File()
}

// copyHelper runs a copy in the helper process: "copy-in ROOT PATH INTO
// MAX" extracts the tar stream on the connection; "copy-out PATH MAX"
// writes PATH's stream to it. It prints the stream's size on stdout, and
// after it, for a failure, its kind (wire.CopyStats.Kind) if it has one.
func copyHelper(args []string) (err error) {
	// The helper runs as the snippets' user: no snippet may trace it.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	conn := os.NewFile(3, "connection")
	rest := os.NewFile(4, "rest")
	counter := &countWriter{}
	defer func() { fmt.Println(counter.n, copyKind(err)) }()
	switch {
	case len(args) == 5 && args[0] == "copy-in":
		max, err := strconv.ParseInt(args[4], 10, 64)
		if err != nil {
			return err
		}
		stream := wire.FrameReader(bufio.NewReaderSize(io.MultiReader(rest, conn), 1<<20))
		if err := copyIn(args[1], args[2], args[3] == "true", max, io.TeeReader(stream, counter)); err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, stream) // tar's zero blocks and padding: up to the end
		return err
	case len(args) == 3 && args[0] == "copy-out":
		max, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return err
		}
		p := args[1]
		fw := wire.FrameWriter(io.MultiWriter(conn, counter))
		if err := safetar.Archive(fw, p, filepath.Base(p), max); err != nil {
			return err // without the end of the stream: the client fails the copy
		}
		return fw.Close()
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

// copyKind is the wire.CopyStats.Kind of a copy's error err ("" for nil
// or another kind).
func copyKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errdefs.IsResourceExhausted(err):
		return wire.CopyNoSpace
	case errors.Is(err, safetar.ErrTooLarge):
		return wire.CopyTooLarge
	case errors.Is(err, unix.ENOENT), errdefs.IsNotFound(err):
		return wire.CopyNotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return wire.CopyPermissionDenied
	case errdefs.IsAlreadyExists(err):
		return wire.CopyExists
	}
	return ""
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
