package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
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

// cancelDelay is how long a killed runsc's output pipes may stay open (held
// by a process it started that escaped its process group) before the wait
// for it gives up on them.
const cancelDelay = 2 * time.Second

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

// invocation is one runsc command.
type invocation struct {
	bin  string   // the runsc binary
	sub  string   // the runsc command (run, kill...): its bound, and what errors say
	args []string // every argument, global flags first
	// stdio, if not nil, is the command's stdout and stderr (and, for run
	// and restore, the container's first process's); else they are read.
	stdio *os.File
	// pdeath kills runsc if flmbox dies (run and restore: a runsc that
	// outlived a killed caller could finish making a container after its
	// caller's clean-up looked for it).
	pdeath bool
	// bound, if not zero, replaces the command's default bound.
	bound time.Duration
}

// run runs the invocation and returns what it printed on stdout. runsc runs
// in a process group of its own, which is killed (SIGKILL) when ctx ends or
// the command's bound passes: the error then matches ctx's error (and its
// cause), or is a *TimeoutError. A runsc that fails says so with the end
// of what it printed on stderr, and the *exec.ExitError in the chain.
func (inv invocation) run(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("runsc %s: %w", inv.sub, ctxErr(ctx))
	}
	bound := inv.bound
	if bound == 0 {
		bound = defaultBounds[inv.sub]
	}
	if bound == 0 {
		bound = defaultBound
	}
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	cmd := exec.CommandContext(cctx, inv.bin, inv.args...)
	cmd.Env = withoutEnv(os.Environ(), "NOTIFY_SOCKET") // runsc would talk to systemd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The whole group: runsc's helpers, or a script's children.
		err := unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		if err == unix.ESRCH {
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = cancelDelay
	var stdout, stderr bytes.Buffer
	if inv.stdio != nil {
		cmd.Stdout, cmd.Stderr = inv.stdio, inv.stdio
	} else {
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
	}
	if inv.pdeath {
		// Pdeathsig follows the thread that forked runsc, not the
		// process: that thread must live until runsc is done.
		cmd.SysProcAttr.Pdeathsig = unix.SIGKILL
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
	}
	err := cmd.Run()
	switch {
	case err == nil:
		return stdout.Bytes(), nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("runsc %s: %w", inv.sub, ctxErr(ctx))
	case cctx.Err() != nil:
		return nil, &TimeoutError{Command: inv.sub, Bound: bound}
	}
	if msg := lastLine(stderr.Bytes()); msg != "" {
		return nil, fmt.Errorf("runsc %s: %w: %s", inv.sub, err, msg)
	}
	return nil, fmt.Errorf("runsc %s: %w", inv.sub, err)
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

// withoutEnv returns env without the variables names.
func withoutEnv(env []string, names ...string) []string {
	out := make([]string, 0, len(env))
next:
	for _, v := range env {
		for _, n := range names {
			if strings.HasPrefix(v, n+"=") {
				continue next
			}
		}
		out = append(out, v)
	}
	return out
}

// command returns the invocation of runsc command sub on c, with runsc's
// global flags (Args) and the Runtime's bound for sub.
func (r *Runtime) command(c Container, sub string, args ...string) invocation {
	return invocation{bin: r.runsc, sub: sub, args: r.Args(c, append([]string{sub}, args...)...), bound: r.bounds[sub]}
}
