// Package runcmonitor is the go-runc ProcessMonitor flmbox runs runsc
// with: every runsc command that package runtime and the bench's raw runsc
// baselines run through github.com/containerd/go-runc leads a process group
// of its own (runc.Runc's Setpgid), which is killed whole (SIGKILL) when
// the command's context ends, and whose output pipes a killed command's
// escaped children may hold open only for WaitDelay. A call also hands its
// caller what go-runc's errors do not carry: runsc's exit (the
// *exec.ExitError of its wait) and what it printed on stderr, kept apart
// from the stdout go-runc parses.
//
// go-runc's Monitor is a package variable, so it is set for the whole
// process, once, by the first Call; commands that no Call started (another
// user of go-runc in the same process) go to the monitor it replaced.
package runcmonitor

import (
	"bytes"
	"context"
	"errors"
	goio "io"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/errkind"
)

// WaitDelay is how long a killed runsc's output pipes may stay open (held
// by a process it started that escaped its process group) before the wait
// for it gives up on them.
const WaitDelay = 2 * time.Second

// tagEnv is the variable of a command's environment (go-runc's
// WithExtraEnv, its per-call setting) that names the Call it belongs to.
// The monitor removes it before runsc starts.
const tagEnv = "FLMBOX_RUNSC_CALL"

// ErrNotMonitored reports that a runsc command ran without this package's
// monitor (runc.Monitor was replaced after it was set): nothing bounded it
// or would have killed its process group.
// It matches errdefs.ErrInternal.
var ErrNotMonitored = errkind.New(errdefs.ErrInternal, "go-runc's Monitor is not flmbox's, so runsc ran unbounded: internal")

// Outcome is what one runsc command of a Call did.
type Outcome struct {
	// Err is the error of the command's wait: an *exec.ExitError if runsc
	// failed or was killed, exec.ErrWaitDelay if it succeeded but a
	// process it started held its output open; nil if it succeeded.
	Err error
	// Stderr is what runsc printed on stderr, when go-runc captured its
	// output (a command given its own stdio, runc.IO, prints there).
	Stderr []byte
	// Started says that runsc started (f's error, then, is not that it
	// could not).
	Started bool
}

var (
	install sync.Once
	calls   sync.Map // tag → *Outcome
	ours    sync.Map // *exec.Cmd started here → struct{}
	nextTag atomic.Uint64
)

// Call runs f, one go-runc method call, with ctx tagged so that the runsc
// command it runs is prepared by this package's monitor (Prepare), and
// returns what that command did and f's error. ctx should carry the
// command's bound (context.WithTimeout): its end kills the command's
// process group. A command f ran outside the monitor fails with
// ErrNotMonitored.
func Call(ctx context.Context, f func(ctx context.Context) error) (*Outcome, error) {
	install.Do(func() { runc.Monitor = &monitor{next: runc.Monitor} })
	tag := strconv.FormatUint(nextTag.Add(1), 10)
	out := &Outcome{}
	calls.Store(tag, out)
	defer calls.Delete(tag)
	err := f(runc.WithExtraEnv(ctx, tagEnv+"="+tag))
	if err == nil && !out.Started {
		return out, ErrNotMonitored
	}
	return out, err
}

// Prepare makes cmd, not yet started, a runsc command as the monitor runs
// them: leader of a process group of its own that is killed whole when
// cmd's context ends (exec.CommandContext), its pipes given up WaitDelay
// later, and no NOTIFY_SOCKET in its environment (runsc would talk to
// systemd). It is for the runsc commands go-runc has no method for.
func Prepare(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = without(cmd.Env, "NOTIFY_SOCKET")
	setCancel(cmd)
}

// setCancel makes the end of cmd's context kill cmd's process group, if
// it leads one, else cmd's process, and bounds the wait for its pipes.
func setCancel(cmd *exec.Cmd) {
	group := cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid
	cmd.Cancel = func() error {
		pid := cmd.Process.Pid
		if group {
			pid = -pid // the whole group: runsc's helpers, or a script's children
		}
		err := unix.Kill(pid, unix.SIGKILL)
		if err == unix.ESRCH {
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = WaitDelay
}

// monitor is the runc.ProcessMonitor: a command that a Call started is
// prepared (setCancel, its tag removed, its stderr kept apart) and waited
// for here; any other goes to next, the monitor it replaced.
type monitor struct{ next runc.ProcessMonitor }

func (m *monitor) Start(cmd *exec.Cmd) (chan runc.Exit, error) {
	if out := take(cmd); out != nil {
		return start(cmd, out, false)
	}
	return m.next.Start(cmd)
}

// StartLocked is Start for a command with a parent-death signal, which
// follows the thread that forked it, not the process: that thread stays
// locked until the command is done.
func (m *monitor) StartLocked(cmd *exec.Cmd) (chan runc.Exit, error) {
	if out := take(cmd); out != nil {
		return start(cmd, out, true)
	}
	return m.next.StartLocked(cmd)
}

// Wait returns the command's exit status (-1 if a signal killed it). Its
// error, and what else went wrong, is in the Call's Outcome.
func (m *monitor) Wait(cmd *exec.Cmd, ec chan runc.Exit) (int, error) {
	if _, ok := ours.LoadAndDelete(cmd); !ok {
		return m.next.Wait(cmd, ec)
	}
	e := <-ec
	return e.Status, nil
}

// take returns the Outcome of the Call that cmd belongs to, and removes
// the Call's tag from cmd's environment; nil if no Call started cmd.
func take(cmd *exec.Cmd) *Outcome {
	var tag string
	for _, v := range cmd.Env {
		if t, ok := strings.CutPrefix(v, tagEnv+"="); ok {
			tag = t
		}
	}
	if tag == "" {
		return nil
	}
	v, ok := calls.Load(tag)
	if !ok {
		return nil
	}
	cmd.Env = without(cmd.Env, tagEnv)
	return v.(*Outcome)
}

// start starts cmd and waits for it in a goroutine (locked to its thread
// if locked), as go-runc's own monitor does, recording its wait's error.
func start(cmd *exec.Cmd, out *Outcome, locked bool) (chan runc.Exit, error) {
	setCancel(cmd)
	if _, captured := cmd.Stdout.(*bytes.Buffer); captured && (cmd.Stderr == nil || cmd.Stderr == cmd.Stdout) {
		// go-runc's own capture (both into one buffer, which it parses
		// as JSON, or quotes whole in its error): stderr is kept apart.
		// A command given files (runc.IO) keeps them: a pipe there would
		// be held open by the sandbox a detached run leaves.
		cmd.Stderr = (*stderrBuffer)(out)
	}
	out.Started = true
	started := make(chan error, 1)
	ec := make(chan runc.Exit, 1)
	go func() {
		if locked {
			goruntime.LockOSThread()
			defer goruntime.UnlockOSThread()
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		out.Err = err
		status := 0
		if err != nil {
			status = 255
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				status = ee.ExitCode()
			}
		}
		ec <- runc.Exit{Timestamp: time.Now(), Pid: cmd.Process.Pid, Status: status}
		close(ec)
	}()
	if err := <-started; err != nil {
		out.Err = err
		return nil, err
	}
	ours.Store(cmd, struct{}{})
	return ec, nil
}

// FileIO is a runc.IO that gives runsc (and, for a command that starts a
// container, the container's first process) one file as stdout and stderr,
// and no stdin: a file, not a pipe, which a detached container would hold
// open.
type FileIO struct{ F *os.File }

func (o FileIO) Close() error            { return nil }
func (o FileIO) Stdin() goio.WriteCloser { return nil }
func (o FileIO) Stdout() goio.ReadCloser { return nil }
func (o FileIO) Stderr() goio.ReadCloser { return nil }
func (o FileIO) Set(cmd *exec.Cmd)       { cmd.Stdout, cmd.Stderr = o.F, o.F }

// stderrBuffer writes into its Outcome's Stderr.
type stderrBuffer Outcome

func (b *stderrBuffer) Write(p []byte) (int, error) {
	b.Stderr = append(b.Stderr, p...)
	return len(p), nil
}

// without returns env without the variables names.
func without(env []string, names ...string) []string {
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
