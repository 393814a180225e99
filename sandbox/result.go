package sandbox

import (
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Result is the outcome of a call whose snippet ran (or was interrupted):
// how it ended and what it wrote. A snippet the sandbox could not start
// gives no Result but a *NotRunError.
type Result struct {
	// ExitCode is the snippet's exit status, or 128+N if signal N killed
	// it (137 for one killed on timeout, for memory or by an interrupt);
	// -1 for one interrupted before it started.
	ExitCode int
	// Stdout and Stderr are what it wrote to each stream.
	Stdout, Stderr Output
	// TimedOut says that it ran out of Request.Timeout and was killed.
	TimedOut bool
	// OOMKilled says that it was killed (SIGKILL) because the sandbox was
	// running out of memory, its processes' and its /tmp's together.
	OOMKilled bool
	// Interrupted says that the call's ctx ended before the snippet did: it
	// was killed (or never started), and the call's error matches
	// ErrInterrupted.
	Interrupted bool
	// Signal names the signal that ended it ("SIGKILL"), if one did.
	Signal string
	// Duration is the wall time of its process, from start to exit.
	Duration time.Duration
	// Callbacks counts its callback connections, for a call with a
	// Callback.
	Callbacks *CallbackStats
}

// Output is what a snippet wrote to one stream.
type Output struct {
	// Data is the output, unchanged (not necessarily UTF-8), or, when it
	// was longer than the request's MaxOutput (Truncated), its first
	// MaxOutput/2 bytes: always an exact prefix of what the snippet wrote.
	Data []byte
	// Tail, when Truncated, is the output's last MaxOutput/2 bytes; the
	// Total-len(Data)-len(Tail) bytes between Data and Tail are left out.
	Tail []byte
	// Total is the number of bytes the snippet wrote to the stream.
	Total int64
	// Truncated says that Data is a prefix of the output, not all of it.
	Truncated bool
}

// CallbackStats count a call's callback connections: those forwarded to
// the caller's Dial, those refused (closed at once: over MaxConns, not
// taken in time, or made from outside the call's processes), and the
// bytes forwarded to the snippet (BytesIn) and from it (BytesOut).
type CallbackStats struct {
	Connections, Refused int
	BytesIn, BytesOut    int64
}

// NotRunError is the error of a call whose snippet the sandbox's agent
// could not start: nothing ran. It matches errdefs.ErrFailedPrecondition,
// and ErrNoInterpreter when the program that runs the snippet is not in the
// image.
type NotRunError struct {
	// Sandbox is the sandbox's name.
	Sandbox string
	// Reason is the agent's: "interpreter 3.12: the sandbox has no
	// python3.12 in its PATH; it has python3, python3.11".
	Reason string
	// NoInterpreter says that the program that runs the snippet (the
	// request's Interpreter, the image's Python, its /bin/sh) is not in
	// the image.
	NoInterpreter bool
}

func (e *NotRunError) Error() string {
	return fmt.Sprintf("sandbox %q could not run the snippet: %s", e.Sandbox, e.Reason)
}

// Is matches ErrNoInterpreter for a missing interpreter.
func (e *NotRunError) Is(target error) bool { return target == ErrNoInterpreter && e.NoInterpreter }

// Unwrap makes a NotRunError match its kind.
func (e *NotRunError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// ErrNoInterpreter is in the error of a call whose program (its
// Request.Interpreter, the image's Python, its /bin/sh) is not in the
// sandbox's image (a *NotRunError); it is
// errdefs.ErrFailedPrecondition.
var ErrNoInterpreter = errkind.New(errdefs.ErrFailedPrecondition, "no such interpreter in the image")

// publicResult is the Result and error a caller of sandbox t gets for the
// agent's answer res (and err) to req: the agent's in-band failure to run
// the snippet becomes a *NotRunError; an interrupted call keeps its result.
func publicResult(t target, req *wire.Request, res *wire.Result, err error) (*Result, error) {
	if res == nil {
		return nil, err
	}
	if res.Error != "" && !res.Interrupted && err == nil {
		return nil, &NotRunError{Sandbox: t.name, Reason: res.Error,
			NoInterpreter: res.Missing || req.Interpreter != "" && strings.HasPrefix(res.Error, "interpreter "+req.Interpreter+": ")}
	}
	return fromWire(res), err
}

// fromWire is res as package sandbox says it.
func fromWire(res *wire.Result) *Result {
	out := &Result{ExitCode: res.ExitCode, Stdout: Output(res.Stdout), Stderr: Output(res.Stderr),
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, Interrupted: res.Interrupted, Signal: res.Signal,
		Duration: time.Duration(res.DurationMS * float64(time.Millisecond))}
	if cb := res.Callbacks; cb != nil {
		out.Callbacks = &CallbackStats{Connections: cb.Connections, Refused: cb.Refused, BytesIn: cb.BytesIn, BytesOut: cb.BytesOut}
	}
	return out
}
