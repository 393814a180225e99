package sandbox

import (
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// This file is the package's vocabulary for what it shares with the layers
// below it: a caller of sandbox names these, never runtime's, snippet's or
// record's. Each is sandbox's own, so that go doc shows it whole; a test
// keeps the values the same as the layers' below (vocab_test.go).

// Languages a Request runs.
const (
	Python = "python"
	Shell  = "shell"
)

// Bounds of a Request, checked by Call.
const (
	// MaxTimeout is the longest Request.Timeout.
	MaxTimeout = 24 * time.Hour
	// DefaultMaxOutput is Request.MaxOutput's default.
	DefaultMaxOutput = 1 << 20
	// MaxCodeSize is the most bytes of Request.Code.
	MaxCodeSize = 1 << 20
	// MaxStdinSize is the most bytes of Request.Stdin.
	MaxStdinSize = 8 << 20
	// DefaultCopyBytes is CopyOptions.MaxBytes' default, and MaxCopyBytes
	// its largest value.
	DefaultCopyBytes = 1 << 30
	MaxCopyBytes     = 64 << 30
)

// Bounds of a Callback (see its fields).
const (
	DefaultCallbackConns = 50
	DefaultCallbackBytes = 256 << 20
	MaxCallbackConns     = 1024
	MaxCallbackBytes     = 16 << 30
	MaxCallbackIdle      = MaxTimeout
	// CallbackSocketEnv names the variable in which a snippet finds its
	// callback socket's path.
	CallbackSocketEnv = "FLMBOX_CALLBACK_SOCKET"
)

// PythonVersion returns the interpreter's command for a Python version
// given as a Request's Interpreter may give it ("3.12" → "python3.12"), or
// "" if name is not a version.
func PythonVersion(name string) string { return wire.PythonVersion(name) }

// Limits are a sandbox's resource limits (Spec.Limits): MemoryBytes bounds
// the memory that its snippets' processes and /tmp use together (a snippet
// that would exceed it is killed, not the sandbox), CPUs its CPU time in
// CPUs, and Pids the processes and threads of the snippets' user, all calls
// together.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes"`
	CPUs        float64 `json:"cpus"`
	Pids        int64   `json:"pids"`
}

// Network is a sandbox's network.
type Network string

// Networks.
const (
	// NetworkNone gives the sandbox only a loopback interface.
	NetworkNone Network = "none"
	// NetworkHost passes the host's network through to the sandbox: code
	// in it reaches whatever the host reaches.
	NetworkHost Network = "host"
)

// ParseNetwork returns the network s names ("none", "host" or "egress"),
// or an errdefs.ErrInvalidArgument error.
func ParseNetwork(s string) (Network, error) {
	switch n := Network(s); n {
	case NetworkNone, NetworkHost, NetworkEgress:
		return n, nil
	}
	return "", fmt.Errorf("network %q: want none, host or egress: %w", s, errdefs.ErrInvalidArgument)
}

// runscNetwork is runsc's network mode for n.
func runscNetwork(n Network) runtime.Network {
	if n == NetworkEgress {
		return runtime.NetworkSandbox
	}
	return runtime.Network(n)
}

// Errors of calls, besides those of call.go, that a caller may test for
// with errors.Is.
var (
	// ErrInterrupted is in the error of a call that its ctx ended: the
	// snippet was killed, and Result (Interrupted) holds what it printed.
	ErrInterrupted = wire.ErrInterrupted
	// ErrHungUp is in the error of a call whose agent went away without an
	// answer (its sandbox died during the call).
	ErrHungUp = wire.ErrHungUp
	// ErrProtocolVersion is in the error of a call to a sandbox made by
	// another flmbox, whose agent speaks another protocol; it is
	// errdefs.ErrFailedPrecondition.
	ErrProtocolVersion = wire.ErrProtocolVersion
	// ErrPooled is in the error of a call to a sandbox idle in a pool,
	// which only Acquire hands out; it is errdefs.ErrFailedPrecondition.
	ErrPooled = record.ErrPooled
)

// Errors of runsc, gVisor's runtime, that a caller may test for.
var (
	// ErrRunscNotFound: no runsc binary where one was looked for
	// (errdefs.ErrNotFound).
	ErrRunscNotFound = runtime.ErrRunscNotFound
	// ErrRunscNotExecutable: the runsc named is not an executable file
	// (errdefs.ErrInvalidArgument).
	ErrRunscNotExecutable = runtime.ErrRunscNotExecutable
	// ErrPlatformUnsupported: Spec.Platform names a gVisor platform this
	// host cannot run (errdefs.ErrInvalidArgument).
	ErrPlatformUnsupported = runtime.ErrPlatformUnsupported
)

// RunscTimeoutError is in the error of a runsc command that did not end
// within its bound and was killed, with its process group (runsc hung):
// errors.As finds it. Its fields are Command, the runsc command (run, kill,
// delete, state...), and Bound, the time.Duration it was given; it matches
// errdefs.ErrUnavailable and context.DeadlineExceeded. It is the runsc
// driver's own type, which every error of runsc carries up unchanged.
type RunscTimeoutError = runtime.TimeoutError
