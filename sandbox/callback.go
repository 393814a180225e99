package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Callback is a call's channel out of its sandbox: for the length of the
// call, the snippet finds a Unix socket's path in FLMBOX_CALLBACK_SOCKET
// (CallbackSocketEnv) and in the variables Env names, and every
// connection it makes to it is forwarded, as a byte stream both ways, to a
// new connection that Dial makes on the host (to the caller's own server).
// When the call ends (exit, timeout, interrupt) the socket goes and every
// forwarded connection is closed. The agent forwards only the call's own
// processes' connections, and only to what Dial returns: nothing else of the
// host is reachable through it (docs/ARCHITECTURE.md, "Callbacks").
type Callback struct {
	// Dial makes the host's end of one connection. A connection it fails to
	// make is refused: the snippet's is closed (Result.Callbacks.Refused).
	Dial func(ctx context.Context) (net.Conn, error)
	// Env names more variables set to the socket's path, such as
	// HERMES_RPC_SOCKET.
	Env []string
	// MaxConns, MaxBytes and Idle are the call's limits (zero: the
	// defaults, DefaultCallbackConns connections and
	// DefaultCallbackBytes for the whole call, both ways, no idle
	// cut): past MaxConns a connection is closed at once; the connection
	// whose bytes cross MaxBytes is cut, and later ones are closed at once;
	// one idle (no byte either way) for Idle, if set, is cut. A connection
	// may otherwise stay open, silent or not, as long as the call runs.
	// Result.Callbacks.Refused counts the connections closed at once: over
	// MaxConns, made by a process that is not the call's (counted in the
	// call that owns the socket), or whose Dial failed.
	MaxConns int
	MaxBytes int64
	Idle     time.Duration
}

// DialUnix returns a Callback's Dial that connects to the Unix socket at
// path, after checking that it is one (errdefs.ErrInvalidArgument if not).
func DialUnix(path string) (func(ctx context.Context) (net.Conn, error), error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("callback socket: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("callback socket %s is %s, not a socket: %w", path, fileKind(fi.Mode()), errdefs.ErrInvalidArgument)
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}, nil
}

// fileKind names a file's type, for an error.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "not a socket (" + m.Type().String() + ")"
}

// wire returns c as the agent's protocol carries it.
func (c *Callback) wire() (*wire.Callback, error) {
	if c.Dial == nil {
		return nil, fmt.Errorf("callback: no Dial: %w", errdefs.ErrInvalidArgument)
	}
	if c.Idle < 0 || c.Idle > 0 && c.Idle < time.Millisecond {
		return nil, fmt.Errorf("callback idle time %s: want at least 1ms: %w", c.Idle, errdefs.ErrInvalidArgument)
	}
	return &wire.Callback{Env: c.Env, MaxConns: c.MaxConns, MaxBytes: c.MaxBytes, IdleMS: c.Idle.Milliseconds()}, nil
}

// dialer is the wire request's CallbackDial for c's Dial: a connection it
// cannot make within dialTimeout is refused.
func (c *Callback) dialer() func(ctx context.Context) (io.ReadWriteCloser, error) {
	return func(ctx context.Context) (io.ReadWriteCloser, error) {
		ctx, cancel := context.WithTimeout(ctx, dialTimeout)
		defer cancel()
		return c.Dial(ctx)
	}
}

// dialTimeout bounds a Callback's Dial.
const dialTimeout = 10 * time.Second
