package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/runcmonitor"
)

// How long each runsc command may take before it is killed. A runsc command
// that waits on a gVisor sandbox which never answers (a platform this host
// cannot run, a stopped or wedged sandbox, another runsc holding the
// container's lock for ever) waits for ever: none may. Commands that make
// a sandbox boot a kernel and mount its tree, on a host that may be busy
// with many others, or read or write its whole memory: minutes. Commands
// that only talk to a running sandbox or read runsc's state take
// milliseconds when all is well; seconds are the bound, so that a command
// that hangs is said in about the time a person waits.
var defaultBounds = map[string]time.Duration{
	"run":        2 * time.Minute, // a runsc run --detach: the sandbox boots, its first process starts
	"restore":    3 * time.Minute, // its memory read back from the checkpoint (GiBs)
	"checkpoint": 5 * time.Minute, // its memory written out, synced
	"delete":     20 * time.Second,
	"kill":       10 * time.Second,
	"state":      10 * time.Second,
	"list":       10 * time.Second,
	"--version":  10 * time.Second,
	"flags":      10 * time.Second,
}

// defaultBound bounds a runsc command that defaultBounds does not name.
const defaultBound = 10 * time.Second

// TimeoutError reports that a runsc command did not finish within its
// bound and was killed, with every process of its process group. It
// matches errdefs.ErrUnavailable and context.DeadlineExceeded.
type TimeoutError struct {
	// Command is the runsc command: run, kill, delete, state...
	Command string
	// Bound is how long it was given.
	Bound time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("runsc %s did not finish in %s, so it was killed", e.Command, e.Bound)
}

// Unwrap makes a TimeoutError match its kind and the deadline's error.
func (e *TimeoutError) Unwrap() []error {
	return []error{errdefs.ErrUnavailable, context.DeadlineExceeded}
}

// runc returns go-runc's client for runsc commands on c: runsc's global
// flags as Args gives them, runsc leading a process group of its own (which
// runcmonitor kills whole when its command's context ends) and, with
// pdeath, killed if flmbox dies (run and restore: a runsc that outlived a
// killed caller could finish making a container after its caller's
// clean-up looked for it; go-runc keeps the thread that forked it, which
// the signal follows, locked until it is done).
func (r *Runtime) runc(c Container, pdeath bool) *runc.Runc {
	rc := &runc.Runc{Command: r.runsc, Root: r.root, ExtraArgs: globalFlags(c), Setpgid: true}
	if pdeath {
		rc.PdeathSignal = unix.SIGKILL
	}
	return rc
}

// call runs f, a go-runc call that runs runsc command sub, with ctx bounded
// by sub's bound (the Runtime's, else defaultBounds'): see bounded.
func (r *Runtime) call(ctx context.Context, sub string, f func(ctx context.Context) error) error {
	return bounded(ctx, sub, r.bounds[sub], f)
}

// bounded runs f, a go-runc call that runs runsc command sub, through
// runcmonitor: runsc runs in a process group of its own, which is killed
// (SIGKILL) when ctx ends or the command's bound passes (bound, if not
// zero, else defaultBounds'). The error then matches ctx's error (and its
// cause), or is a *TimeoutError. A runsc that fails says so with the line
// of its stderr that says why, and the *exec.ExitError in the chain.
func bounded(ctx context.Context, sub string, bound time.Duration, f func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("runsc %s: %w", sub, ctxErr(ctx))
	}
	bound = boundOf(sub, bound)
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	out, err := runcmonitor.Call(cctx, f)
	if err != nil && out.Started && out.Err == nil && ctx.Err() == nil {
		// runsc succeeded; go-runc could not read what it printed.
		return fmt.Errorf("runsc %s: read its output: %w: %w", sub, err, errdefs.ErrUnknown)
	}
	return classify(ctx, cctx, sub, bound, err, out.Err, out.Stderr)
}

// boundOf is runsc command sub's bound: bound if not zero, else its default.
func boundOf(sub string, bound time.Duration) time.Duration {
	if bound == 0 {
		bound = defaultBounds[sub]
	}
	if bound == 0 {
		bound = defaultBound
	}
	return bound
}

// classify is the error of runsc command sub, run under cctx (ctx with its
// bound): nil if it succeeded (err nil); ctx's error if ctx ended; a
// *TimeoutError if the bound passed; else its wait's error (waitErr, an
// *exec.ExitError if runsc ran and failed) with the line of stderr that
// says why, or err.
func classify(ctx, cctx context.Context, sub string, bound time.Duration, err, waitErr error, stderr []byte) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("runsc %s: %w", sub, ctxErr(ctx))
	case cctx.Err() != nil:
		return &TimeoutError{Command: sub, Bound: bound}
	case waitErr == nil:
		return fmt.Errorf("runsc %s: %w", sub, err)
	}
	if msg := lastLine(stderr); msg != "" {
		return fmt.Errorf("runsc %s: %w: %s", sub, waitErr, msg)
	}
	return fmt.Errorf("runsc %s: %w", sub, waitErr)
}

// runOwn runs runsc with args, a command go-runc has no method for (sub:
// --version, flags), bounded and killed with its process group as bounded
// runs go-runc's (runcmonitor.Prepare). Its stdout and stderr go to stdio
// if not nil; else it returns its stdout.
func runOwn(ctx context.Context, runsc, sub string, stdio *os.File, args ...string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("runsc %s: %w", sub, ctxErr(ctx))
	}
	bound := boundOf(sub, 0)
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	cmd := exec.CommandContext(cctx, runsc, args...)
	runcmonitor.Prepare(cmd)
	var stdout, stderr bytes.Buffer
	if stdio != nil {
		cmd.Stdout, cmd.Stderr = stdio, stdio
	} else {
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
	}
	err := cmd.Run()
	if err := classify(ctx, cctx, sub, bound, err, err, stderr.Bytes()); err != nil {
		return nil, err
	}
	return stdout.Bytes(), nil
}

// ctxErr is ctx's error, with its cause if that says more (which signal
// interrupted flmbox), both in the chain.
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	switch {
	case cause == nil || cause == err:
		return err
	case errors.Is(cause, err):
		return cause // an *runcmd.Interrupt matches context.Canceled
	}
	return fmt.Errorf("%w: %w", err, cause)
}

// lastLine returns the line of b where runsc says why it failed, at most
// 512 bytes of it: its panic line if it panicked (a stack trace follows
// it), else its last non-empty line (its earlier lines are warnings).
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	for _, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "panic: ") {
			l = strings.TrimSpace(line)
			break
		}
	}
	if len(l) > 512 {
		l = l[len(l)-512:]
	}
	return l
}
