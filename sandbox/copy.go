package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/errkind"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// ErrTmpFull is in the error of a copy into a sandbox whose /tmp is full
// (its size is Spec.TmpBytes). It is errdefs.ErrResourceExhausted.
var ErrTmpFull = errkind.New(errdefs.ErrResourceExhausted, "the sandbox's /tmp is full: resource exhausted")

// CopyOptions bound a copy.
type CopyOptions struct {
	// MaxBytes bounds the files' contents together (0:
	// DefaultCopyBytes, 1 GiB; at most MaxCopyBytes).
	MaxBytes int64
}

// CopyIn extracts the tar stream r into sandbox name at dst, as the
// sandbox's user, through its agent (no runsc exec): dst must be under
// /tmp. If dst is a directory (or ends with "/": then it must be one) the
// stream's entries go into it; otherwise the stream's one top-level entry
// is written as dst. No link in the sandbox is followed: a path that goes
// through one (a snippet may have replaced any path under /tmp) is
// refused, and nothing is written there. Only directories, regular files
// and symbolic links are copied (a stream with anything else fails); modes
// are kept, set-ID bits and owners are not; a file's zero blocks are left
// as holes, so that a sparse file stays sparse. Each file is written under
// a temporary name and renamed when whole: a copy that fails part way
// leaves the files it finished, never a partial one.
//
// Errors carry errdefs kinds: ErrResourceExhausted when the sandbox's /tmp
// is full (Spec.TmpBytes), ErrNotFound for a missing directory to copy
// into, ErrPermissionDenied, ErrOutOfRange past MaxBytes, ErrInvalidArgument
// for a refused stream or path.
func (m *Manager) CopyIn(ctx context.Context, name, dst string, r io.Reader, o CopyOptions) error {
	return m.copyInTo(ctx, named(name), dst, r, o)
}

func (m *Manager) copyInTo(ctx context.Context, t target, dst string, r io.Reader, o CopyOptions) error {
	name := t.name
	into := strings.HasSuffix(dst, "/") && dst != "/"
	c := &wire.Copy{Op: wire.CopyIn, Path: path.Clean(dst), Into: into, MaxBytes: o.MaxBytes, HandOut: t.handOut}
	res, err := m.copy(ctx, t, c, r, nil)
	if err != nil {
		return err
	}
	if res.Error != "" {
		return fmt.Errorf("copy into sandbox %q at %s: %w", name, dst, copyError(res))
	}
	return nil
}

// CopyOut returns src of sandbox name as a tar stream, read as the
// sandbox's user through its agent: src may be anything that user can
// read (a file, a link, a directory tree), named by its base name in the
// stream. Links are archived as links, never followed; a FIFO, socket or
// device, at src or in its tree, fails the copy (naming it). A failure part
// way is the error of the stream's Read, after the entries sent so far: a
// caller that extracts as it reads should put nothing in place before the
// stream's end (safetar's Atomic extraction). Close ends the copy. Errors
// carry errdefs kinds: ErrNotFound for a missing src, ErrPermissionDenied,
// ErrOutOfRange past MaxBytes, ErrInvalidArgument for what is not copied.
func (m *Manager) CopyOut(ctx context.Context, name, src string, o CopyOptions) (io.ReadCloser, error) {
	return m.copyOutOf(ctx, named(name), src, o)
}

func (m *Manager) copyOutOf(ctx context.Context, t target, src string, o CopyOptions) (io.ReadCloser, error) {
	name := t.name
	rec, err := m.callableAs(ctx, t)
	if err != nil {
		return nil, err
	}
	c := &wire.Copy{Op: wire.CopyOut, Path: path.Clean(src), MaxBytes: o.MaxBytes, HandOut: t.handOut}
	if err := (&wire.Request{Version: wire.ProtocolVersion, Copy: c}).Validate(); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		res, err := copyWith(ctx, rec, c, nil, pw)
		if err == nil && res.Stale {
			err = t.stale()
		} else if err == nil && res.Error != "" {
			err = fmt.Errorf("copy %s out of sandbox %q: %w", src, name, copyError(res))
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// copy runs c on sandbox name.
func (m *Manager) copy(ctx context.Context, t target, c *wire.Copy, r io.Reader, w io.Writer) (*wire.Result, error) {
	rec, err := m.callableAs(ctx, t)
	if err != nil {
		return nil, err
	}
	res, err := copyWith(ctx, rec, c, r, w)
	if res != nil && res.Stale {
		return nil, t.stale()
	}
	return res, err
}

func copyWith(ctx context.Context, rec *record.Record, c *wire.Copy, r io.Reader, w io.Writer) (*wire.Result, error) {
	conn, err := rec.Dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if c.Op == wire.CopyIn {
		growSendBuffer(conn, copyInSendBuffer)
	}
	defer rec.Use()()
	res, err := wire.CopyConn(ctx, conn, c, r, w)
	if errors.Is(err, wire.ErrNoCopy) {
		return nil, fmt.Errorf("sandbox %q: %w", rec.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("copy: sandbox %q: %w", rec.Name, err)
	}
	return res, nil
}

// copyInSendBuffer is the send buffer of a copy's connection into a
// sandbox. The agent's copy helper reads it under gVisor, where each read
// of a host socket costs the sentry a wakeup whatever it brings, so a
// buffer larger than the host's default makes a copy faster; beyond a few
// MiB it no longer does (docs/PERFORMANCE.md, "Copies"). (Out of a sandbox the sender is the sentry's socket, whose buffer a
// setsockopt inside does not change.)
const copyInSendBuffer = 2 << 20

// growSendBuffer sets the send buffer of the socket f to n bytes, over the
// host's net.core.wmem_max where flmbox may (CAP_NET_ADMIN), else up to
// it. A buffer left smaller only makes the copy slower.
func growSendBuffer(f *os.File, n int) {
	rc, err := f.SyscallConn() // not Fd: that would make f blocking
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n) != nil {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, n)
		}
	})
}

// copyError is the error of a failed copy's result: the agent's message
// with the errdefs kind of its CopyStats.Kind (an invalid argument if it
// has none).
func copyError(res *wire.Result) error {
	msg := copyMessage(res.Error)
	var kind string
	if res.Copied != nil {
		kind = res.Copied.Kind
	}
	switch kind {
	case wire.CopyNoSpace:
		return fmt.Errorf("%s: %w", msg, ErrTmpFull)
	case wire.CopyNotFound:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrNotFound)
	case wire.CopyPermissionDenied:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrPermissionDenied)
	case wire.CopyTooLarge:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrOutOfRange)
	case wire.CopyExists:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrAlreadyExists)
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument)
}

// copyMessage is the agent's message of a failed copy without its program's
// name and its kind, which the error adds again.
func copyMessage(msg string) string {
	msg = strings.TrimPrefix(msg, "flmbox-agent: ")
	for _, kind := range []string{": invalid argument", ": already exists", ": out of range", ": not found", ": resource exhausted", ": permission denied"} {
		msg = strings.TrimSuffix(msg, kind)
	}
	return msg
}
