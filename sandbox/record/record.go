// Package record is a sandbox's directory on the host,
// ROOT/sandboxes/NAME: its record (sandbox.json), its agent's socket and the
// mark of its last use, and one call to its agent.
//
// Package sandbox writes records and owns their life; this package is the
// part of it that a warm call needs, apart so that the flmbox command can
// make warm calls without importing package sandbox (go-containerregistry
// and package runtime cost milliseconds of start). It imports nothing heavier than
// package wire.
package record

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/internal/memcg"
	"github.com/flmbox/flmbox/internal/names"
	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/snippet/wire"
)

// State is a sandbox's state (package sandbox's State); these are the
// states a record holds. A sandbox is Creating from the moment
// its record is written (before anything a crash could leave behind: a
// lease, a runsc container) until its agent answers and its preinstalls are
// done, then Running until it is removed (Removing). Whether a Running
// sandbox is alive is not recorded: its processes may die at any moment.
type State string

// Recorded states.
const (
	Creating State = "creating"
	Running  State = "running"
	Removing State = "removing"
	// Suspending: a suspend is at work; Suspended: the sandbox is saved
	// in its checkpoint image and has no process; Resuming: a resume is at
	// work. Reconcile ends a suspend or resume that was killed: suspended
	// if the checkpoint image is whole, else running.
	Suspending State = "suspending"
	Suspended  State = "suspended"
	Resuming   State = "resuming"
)

// Limits are a sandbox's limits (package sandbox's Limits, documented there),
// as recorded.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes"`
	CPUs        float64 `json:"cpus"`
	Pids        int64   `json:"pids"`
}

// Record is ROOT/sandboxes/NAME/sandbox.json.
type Record struct {
	Name string `json:"name"`
	ID   string `json:"id"` // runsc's container ID
	// HandOut names the sandbox's current holding: a random word made by
	// its create and by each release into its pool (whose reset gives it to
	// the agent too). A handle keeps the hand-out it was given with, so
	// that it never reaches the sandbox's next holder. Empty in records of
	// before it.
	HandOut string `json:"hand_out,omitempty"`
	// Labels are its holder's (sandbox.Spec.Labels).
	Labels   map[string]string `json:"labels,omitempty"`
	Image    string            `json:"image"`
	Manifest string            `json:"manifest,omitempty"` // the cached image it leases
	Network  string            `json:"network"`
	Platform string            `json:"platform,omitempty"` // gVisor's; empty: runsc's default
	Limits   Limits            `json:"limits"`
	State    State             `json:"state"`
	// Created is when the record was first written.
	Created time.Time `json:"created"`
	// Owner is the process the sandbox belongs to, if any
	// (sandbox.Spec.Ephemeral): once it is gone, Reconcile removes the
	// sandbox.
	Owner *Owner `json:"owner,omitempty"`
	// Process is the sandbox's gVisor sandbox process (runsc's) while it
	// runs: once that is gone, so is the sandbox (Process.Gone). Nil while it
	// is made or suspended, and in records of older flmbox.
	Process *Process `json:"process,omitempty"`
	// ImageBytes is the size of a suspended sandbox's checkpoint image,
	// written when it was suspended (0 in records of older flmbox).
	ImageBytes int64 `json:"image_bytes,omitempty"`
	// Shape is the key of what the sandbox is made of (its image's
	// manifest, network, platform, limits, /tmp, environment, pip
	// requirements, mounts): sandboxes of one shape are interchangeable once
	// reset, and share a pool. Empty for sandboxes made before pools.
	Shape string `json:"shape,omitempty"`
	// Pooled is when the sandbox, reset, was parked idle in the pool of its
	// shape; nil while it is in use. An idle pooled sandbox takes no calls.
	Pooled *time.Time `json:"pooled,omitempty"`
	// Lease is the holder of its image lease, if not Name.ID (a pooled
	// sandbox keeps the lease it was made with under every name it takes).
	Lease string `json:"lease,omitempty"`
	// Egress is the policy and addresses of a sandbox whose network is
	// egress.
	Egress *Egress `json:"egress,omitempty"`

	// Dir is the sandbox's directory (not stored).
	Dir string `json:"-"`
}

// Egress is an egress sandbox's policy (rules in their text form) and the
// addresses of its link: the gateway (the host's side) and its own.
type Egress struct {
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
	DNS     []string `json:"dns,omitempty"`
	Gateway string   `json:"gateway,omitempty"`
	Addr    string   `json:"addr,omitempty"`
}

const recordFile = "sandbox.json"

// Dir returns the directory of sandbox name under the state root, after
// checking the name: 1 to 64 of [A-Za-z0-9_.-], starting with a letter or
// digit (errdefs.ErrInvalidArgument otherwise).
func Dir(root, name string) (string, error) {
	if !names.Valid(name, 64) {
		return "", fmt.Errorf("sandbox name %q: use 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	return stateroot.Sandbox(root, name), nil
}

// Read reads the record of sandbox name under the state root
// (errdefs.ErrNotFound if there is none).
func Read(root, name string) (*Record, error) {
	dir, err := Dir(root, name)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no sandbox %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read sandbox %q: %w", name, err)
	}
	r := &Record{}
	if err := json.Unmarshal(b, r); err != nil || r.Name != name {
		return nil, fmt.Errorf("read sandbox %q: its record is damaged (%v): %w", name, err, errdefs.ErrDataLoss)
	}
	r.Dir = dir
	return r, nil
}

// ReadDir reads the record in the sandbox directory dir whatever name it
// holds: a sandbox renamed by a pool's Acquire or Release holds its old name
// until its record is written again, and one killed in between is found
// with this (Read fails on it with errdefs.ErrDataLoss).
func ReadDir(dir string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no sandbox in %s: %w", dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read sandbox in %s: %w", dir, err)
	}
	r := &Record{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("read sandbox in %s: its record is damaged (%v): %w", dir, err, errdefs.ErrDataLoss)
	}
	r.Dir = dir
	return r, nil
}

// Renamed says whether the record names another directory than its own: a
// pool's Acquire or Release was killed between renaming the directory and
// writing the record.
func (r *Record) Renamed() bool { return r.Name != filepath.Base(r.Dir) }

// Write writes r into r.Dir atomically (a temporary file, then a rename).
func Write(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := filepath.Join(r.Dir, recordFile)
	if err := atomicfile.WriteFile(p, b, 0o600); err != nil {
		return fmt.Errorf("write sandbox %q's record: %w", r.Name, err)
	}
	return nil
}

// RunDir is the host directory mounted at /dev/.flmbox/run in the sandbox,
// where its agent listens.
func (r *Record) RunDir() string { return filepath.Join(r.Dir, "run") }

// SocketPath is the agent's socket on the host.
func (r *Record) SocketPath() string { return filepath.Join(r.RunDir(), "agent.sock") }

// SnippetLimits are the rlimits of a snippet's process: the snippets' user
// may have Limits.Pids processes and threads in the sandbox, all calls
// together (RLIMIT_NPROC), so that a fork bomb fails its own forks and the
// sandbox lives (its cgroup allows more: runtime.PidsHeadroom). Memory is
// bounded by the agent's memory watch, not by an rlimit.
func (r *Record) SnippetLimits() wire.Limits {
	return wire.Limits{Procs: r.Limits.Pids}
}

const lastUsedFile = "last-used"

// Touch records that the sandbox was just used.
func (r *Record) Touch() {
	p := filepath.Join(r.Dir, lastUsedFile)
	now := time.Now()
	if err := os.Chtimes(p, now, now); errors.Is(err, os.ErrNotExist) {
		os.WriteFile(p, nil, 0o600)
	}
}

// Use marks the sandbox used, as Touch does, and in a call until done is
// called: it holds a shared lock on the file whose time says when it was
// last used (InCall). A call or copy holds it while it runs, whatever
// process makes it.
func (r *Record) Use() (done func()) {
	p := filepath.Join(r.Dir, lastUsedFile)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return func() {}
	}
	now := time.Now()
	os.Chtimes(p, now, now)
	if unix.Flock(fd, unix.LOCK_SH) != nil {
		unix.Close(fd)
		return func() {}
	}
	return func() { unix.Close(fd) }
}

// InCall reports whether a call or copy of the sandbox runs now, in any
// process (see Use).
func (r *Record) InCall() bool {
	fd, err := unix.Open(filepath.Join(r.Dir, lastUsedFile), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == unix.EWOULDBLOCK
}

// LastUsed is when the sandbox was last called, or created.
func (r *Record) LastUsed() time.Time {
	if fi, err := os.Stat(filepath.Join(r.Dir, lastUsedFile)); err == nil {
		return fi.ModTime().UTC()
	}
	return r.Created
}

// ErrDead is in the error of a call to a sandbox whose agent is gone: its
// first process, so the whole gVisor sandbox. It is
// errdefs.ErrFailedPrecondition: a dead sandbox never comes back, it can
// only be removed (a front end must not answer "try again").
var ErrDead = errkind.New(errdefs.ErrFailedPrecondition, "the sandbox is dead (its agent, and so its gVisor sandbox, is gone)")

// ErrUnresponsive is in the error of a call to a sandbox whose agent
// accepts connections but does not answer a ping within PingTimeout: its
// gVisor sandbox is stopped or starved. It is errdefs.ErrUnavailable: it may
// come back.
var ErrUnresponsive = errkind.New(errdefs.ErrUnavailable,
	fmt.Sprintf("the sandbox is unresponsive (its agent accepts connections but did not answer within %s)", PingTimeout))

// ErrSuspended is in the error of a call to a suspended sandbox, which
// must be resumed first. It is errdefs.ErrFailedPrecondition.
var ErrSuspended = errkind.New(errdefs.ErrFailedPrecondition, "it is suspended: resume it first")

// ErrPooled is in the error of a call to a sandbox idle in a pool, kept
// for whoever acquires one of its shape next. It is
// errdefs.ErrFailedPrecondition.
var ErrPooled = errkind.New(errdefs.ErrFailedPrecondition, "it is idle in a pool, for whoever acquires one of its shape next")

// ErrRemoved is in the error of a call whose sandbox was removed while it
// ran. It is errdefs.ErrNotFound.
var ErrRemoved = errkind.New(errdefs.ErrNotFound, "the sandbox was removed during the call")

// PingTimeout bounds the wait for the agent's answer to a ping: an agent
// answers one at once, whatever its calls are doing.
const PingTimeout = 3 * time.Second

// watchdogPeriod is how often a call pings its agent, from this long after
// it starts: a call to an unresponsive agent fails within watchdogPeriod +
// PingTimeout, not at its own timeout.
const watchdogPeriod = 2 * time.Second

// Callable fails with errdefs.ErrFailedPrecondition unless the record is
// Running and in use: a sandbox being created or removed takes no calls but
// its owner's, and one idle in a pool none.
func (r *Record) Callable() error {
	if r.State == Suspended {
		return fmt.Errorf("call sandbox %q: %w", r.Name, ErrSuspended)
	}
	if r.State != Running {
		return fmt.Errorf("call sandbox %q: it is %s: %w", r.Name, r.State, errdefs.ErrFailedPrecondition)
	}
	if r.Pooled != nil {
		return fmt.Errorf("call sandbox %q: %w", r.Name, ErrPooled)
	}
	return nil
}

// Dial connects to the sandbox's agent. It fails with ErrDead if the agent
// refuses connections, and with errdefs.ErrPermissionDenied if a snippet
// replaced the socket (see wire.Dial).
func (r *Record) Dial(ctx context.Context) (*os.File, error) {
	conn, err := wire.Dial(ctx, r.SocketPath())
	if err != nil {
		return nil, r.explain(ctx, err)
	}
	return conn, nil
}

// CallConn makes one call on conn, from Dial, and marks the sandbox used.
// The request's limits are the sandbox's snippet limits. A call whose agent
// hung up fails with ErrDead if the agent no longer accepts connections. An
// interrupted call (ctx cancelled) returns the agent's answer, if any, with
// an error matching wire.ErrInterrupted (see wire.Call).
//
// While the call runs, the agent is pinged every watchdogPeriod on a
// connection of its own: a call to an agent that does not answer its ping
// fails with ErrUnresponsive (or ErrDead) within seconds. And the host's
// count of the sandbox's memory is read every few milliseconds, to tell the
// agent when it grows (wire.Request.MemoryNudges), which then reads its own
// only as it needs to.
func (r *Record) CallConn(ctx context.Context, conn *os.File, req *wire.Request) (*wire.Result, error) {
	req.Limits = r.SnippetLimits()
	if !req.Suspend { // a suspend is not a use: sandbox gc --remove-idle counts from the last call
		defer r.Use()()
	}
	if req.Copy == nil && !req.Suspend && !req.Ping && req.Charged == nil {
		// The host's count of the sandbox's memory, for the agent's
		// memory watch (wire.Request.MemoryNudges); without it, the
		// agent reads by the clock alone.
		if c, err := memcg.Open(r.ID); err == nil {
			defer c.Close()
			req.Charged = c.Read
		}
	}
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := r.watchdog(callCtx, cancel)
	res, err := wire.CallConn(callCtx, conn, req)
	stop()
	if err != nil {
		if cause := context.Cause(callCtx); ctx.Err() == nil && cause != nil {
			return nil, fmt.Errorf("call sandbox %q: %w", r.Name, cause)
		}
		return res, r.explain(ctx, err)
	}
	return res, nil
}

// watchdog pings the agent every watchdogPeriod until stop is called or ctx
// ends, and cancels the call with the ping's error if it fails.
// A ping in flight when the call ends is cancelled.
func (r *Record) watchdog(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	pingCtx, stopPings := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTimer(watchdogPeriod)
		defer t.Stop()
		for {
			select {
			case <-pingCtx.Done():
				return
			case <-t.C:
			}
			if err := r.Ping(pingCtx); err != nil && pingCtx.Err() == nil {
				cancel(abandoned{err})
				return
			}
			t.Reset(watchdogPeriod)
		}
	})
	return func() {
		stopPings()
		wg.Wait()
	}
}

// abandoned is the cause of a call that its watchdog ends: the call is
// abandoned at once, not interrupted (its agent would not answer that
// either).
type abandoned struct{ err error }

func (a abandoned) Error() string        { return a.err.Error() }
func (a abandoned) Unwrap() error        { return a.err }
func (a abandoned) Is(target error) bool { return target == wire.ErrAbandoned }

// Ping checks that the sandbox's agent answers: ErrDead if it refuses
// connections, ErrRemoved if the sandbox is gone, ErrUnresponsive if it
// does not answer within PingTimeout.
func (r *Record) Ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	conn, err := wire.Dial(pctx, r.SocketPath())
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if r.removed() {
			return ErrRemoved
		}
		if pctx.Err() != nil {
			return ErrUnresponsive // its accept queue stays full
		}
		return fmt.Errorf("%w: %w", ErrDead, err)
	}
	defer conn.Close()
	if _, err := wire.CallConn(pctx, conn, wire.PingRequest()); err != nil && !errors.Is(err, wire.ErrProtocolVersion) {
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case r.removed():
			return ErrRemoved
		case pctx.Err() != nil:
			return ErrUnresponsive
		}
		return fmt.Errorf("%w: %w", ErrDead, err)
	}
	return nil
}

// removed says whether the sandbox was removed (or is being removed, or
// another of its name replaced it) since r was read.
func (r *Record) removed() bool {
	now, err := Read(filepath.Dir(filepath.Dir(r.Dir)), r.Name)
	return errors.Is(err, errdefs.ErrNotFound) || err == nil && (now.ID != r.ID || now.State == Removing)
}

// Call dials the agent and makes one call.
func (r *Record) Call(ctx context.Context, req *wire.Request) (*wire.Result, error) {
	conn, err := r.Dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return r.CallConn(ctx, conn, req)
}

// explain adds to err, the failure of a call, that the sandbox is dead if
// its agent no longer accepts connections.
func (r *Record) explain(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, errdefs.ErrPermissionDenied) {
		return fmt.Errorf("call sandbox %q: %w", r.Name, err)
	}
	if r.removed() {
		// One kind: not found (the cause, an agent gone, may say
		// unavailable, which invites a retry).
		return fmt.Errorf("call sandbox %q: %w: %v", r.Name, ErrRemoved, err)
	}
	if !r.Accepts(ctx) || errors.Is(err, wire.ErrHungUp) && r.stopsAccepting(ctx, hangUpGrace) {
		return fmt.Errorf("call sandbox %q: %w: %w", r.Name, ErrDead, err)
	}
	return fmt.Errorf("call sandbox %q: %w", r.Name, err)
}

// hangUpGrace bounds how long a call whose agent hung up waits for the
// sandbox to stop accepting connections. The agent answers every request it
// reads, so one that hung up died, and the sandbox ends with it (its first
// process), but its socket may accept connections for a moment still.
const hangUpGrace = 5 * time.Second

// stopsAccepting reports whether the sandbox's agent stops accepting
// connections within grace.
func (r *Record) stopsAccepting(ctx context.Context, grace time.Duration) bool {
	deadline := time.Now().Add(grace)
	for r.Accepts(ctx) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// Accepts reports whether the sandbox's agent accepts a connection within a
// second: a sandbox whose agent does not is dead.
func (r *Record) Accepts(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := wire.Dial(ctx, r.SocketPath())
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
