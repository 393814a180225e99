package sandbox

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Request is one snippet to run.
type Request struct {
	// Language is Python (the default) or Shell.
	Language string
	// Code is the snippet: Python source, or a shell script.
	Code string
	// Timeout kills the snippet after this long. Default: DefaultTimeout.
	Timeout time.Duration
	// MaxOutput is how many bytes of stdout and of stderr are kept (the
	// first and last halves). Default: DefaultMaxOutput.
	MaxOutput int64
	// Reset first returns the sandbox to a clean state: every other
	// process killed, /tmp and /dev/shm emptied, System V IPC removed.
	Reset bool
	// Stdin is the snippet's standard input (at most MaxStdinSize
	// bytes), then EOF. Default: EOF at once.
	Stdin []byte
	// Env are K=V settings added to the sandbox's environment for this call
	// only; /tmp/site-packages stays first on PYTHONPATH.
	Env []string
	// Interpreter names the program that runs the code in place of the
	// language's python3 or /bin/sh: a command in the image's PATH, such as
	// python3.11 or bash, an absolute path in the image, or for Python a
	// version such as 3.11 (PythonVersion; "python" and "3" are the
	// default). One the image lacks fails the call (Result.Error).
	Interpreter string
	// File, if set, runs the code as a file of that base name (such as
	// main.py), as python3 FILE or sh FILE do: __file__, sys.argv[0] or $0
	// name it, and a new directory under /tmp holds it for the call.
	// Without it, Python code runs as python3 -c does.
	File string
	// CopyIn are copied into the sandbox, in order, before the code runs
	// (after Reset), as Manager.CopyIn copies; one that fails fails the call
	// before any code runs. Batch takes none.
	CopyIn []CopyIn
	// Callback, if set, opens a channel from the snippet to the caller for
	// this call (see Callback).
	Callback *Callback
}

// DefaultTimeout is a Request's default timeout.
const DefaultTimeout = 30 * time.Second

// ErrDead is in the error of a call to a sandbox whose gVisor processes are
// gone; it is errdefs.ErrFailedPrecondition. A dead sandbox can only be
// removed.
var ErrDead = record.ErrDead

// ErrUnresponsive is in the error of a call to a sandbox whose agent does
// not answer (its gVisor sandbox is stopped or starved): the call fails
// within seconds. It is errdefs.ErrUnavailable.
var ErrUnresponsive = record.ErrUnresponsive

// ErrRemoved is in the error of a call whose sandbox was removed while it
// ran. It is errdefs.ErrNotFound.
var ErrRemoved = record.ErrRemoved

// ErrSuspended is in the error of a call to a suspended sandbox, which
// Call does not resume: Resume it, then call again (as the flmbox command
// does, saying so). It is errdefs.ErrFailedPrecondition.
var ErrSuspended = record.ErrSuspended

// wire returns r as the agent's protocol carries it, or what is wrong with
// it (errdefs.ErrInvalidArgument).
func (r Request) wire() (*wire.Request, error) {
	if r.Language == "" {
		r.Language = Python
	}
	if r.Timeout == 0 {
		r.Timeout = DefaultTimeout
	}
	if r.Timeout < time.Millisecond {
		return nil, fmt.Errorf("timeout %s: want at least 1ms: %w", r.Timeout, errdefs.ErrInvalidArgument)
	}
	req := &wire.Request{Version: wire.ProtocolVersion, Language: r.Language, Code: r.Code,
		TimeoutMS: r.Timeout.Milliseconds(), MaxOutput: r.MaxOutput, Reset: r.Reset,
		Stdin: r.Stdin, Env: callEnv(r.Env), Interpreter: r.Interpreter, File: r.File}
	for _, c := range r.CopyIn {
		if c.Open == nil || !strings.HasPrefix(c.Dst, "/") {
			return nil, fmt.Errorf("copy into the sandbox before the call: want an absolute Dst (under /tmp) and an Open, got %q: %w", c.Dst, errdefs.ErrInvalidArgument)
		}
	}
	if r.Callback != nil {
		var err error
		if req.Callback, err = r.Callback.wire(); err != nil {
			return nil, err
		}
	}
	return req, req.Validate()
}

// callEnv is a call's env with /tmp/site-packages first on its PYTHONPATH,
// if it sets one, as Environment does for a sandbox's.
func callEnv(env []string) []string {
	var out []string
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "PYTHONPATH=")
		if !ok {
			continue
		}
		if out == nil {
			out = slices.Clone(env)
		}
		out[i] = "PYTHONPATH=" + withSitePackages(v)
	}
	if out == nil {
		return env
	}
	return out
}

// Validate reports what is wrong with r, if anything
// (errdefs.ErrInvalidArgument).
func (r Request) Validate() error {
	_, err := r.wire()
	return err
}

// Call runs req in sandbox name and returns its result: the snippet's exit
// code (a snippet killed on timeout has TimedOut set, one killed because the
// sandbox ran short of memory OOMKilled) and its output. A snippet the
// sandbox could not start (its Interpreter is not in the image) fails the
// call with a *NotRunError: nothing ran. Cancelling ctx interrupts the call:
// the snippet is killed and Call returns what it printed so far
// (Result.Interrupted) with an error matching ErrInterrupted and ctx's cause
// (no result from an agent of a sandbox made before interrupts existed). A
// call fails with errdefs.ErrNotFound if there is no such sandbox,
// errdefs.ErrFailedPrecondition if it is being created or removed, and ErrDead
// if it is dead. A call to a suspended sandbox fails with ErrSuspended and
// changes nothing: Call never resumes (a resume takes root and a second or
// so, and the caller may rather not); Resume does, then call again. Calls of
// one sandbox may run at once; they share its /tmp.
func (m *Manager) Call(ctx context.Context, name string, req Request) (*Result, error) {
	return m.call(ctx, named(name), req)
}

func (m *Manager) call(ctx context.Context, t target, req Request) (*Result, error) {
	wreq, err := req.wire()
	if err != nil {
		return nil, err
	}
	if len(req.CopyIn) > 0 && wreq.Reset {
		// The reset empties /tmp: it comes before the copies.
		if err := m.reset(ctx, t); err != nil {
			return nil, err
		}
		wreq.Reset = false
	}
	if err := m.copyIn(ctx, t, req.CopyIn); err != nil {
		return nil, err
	}
	res, err := m.callChecked(ctx, t, wreq, req.Callback)
	return publicResult(t, wreq, res, err)
}

// CopyIn is a copy into a sandbox that a call makes before its code runs
// (Request.CopyIn).
type CopyIn struct {
	// Dst is where, as Manager.CopyIn's dst: under /tmp, into it if it
	// ends with "/".
	Dst string
	// Open opens the tar stream to extract there, once per call; the
	// stream is closed after.
	Open func() (io.ReadCloser, error)
	// Options bound the copy.
	Options CopyOptions
}

// copyIn makes a call's copies into sandbox t.
func (m *Manager) copyIn(ctx context.Context, t target, copies []CopyIn) error {
	for _, c := range copies {
		r, err := c.Open()
		if err != nil {
			return fmt.Errorf("copy into sandbox %q at %s: %w", t.name, c.Dst, err)
		}
		err = m.copyInTo(ctx, t, c.Dst, r, c.Options)
		r.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// callChecked runs a request already checked in sandbox t, if it is
// running, forwarding its callback connections to cb's Dial.
func (m *Manager) callChecked(ctx context.Context, t target, req *wire.Request, cb *Callback) (*wire.Result, error) {
	rec, err := m.callableAs(ctx, t)
	if err != nil {
		return nil, err
	}
	if cb != nil || t.handOut != "" {
		r := *req
		if cb != nil {
			r.CallbackDial = cb.dialer()
		}
		r.HandOut = t.handOut
		req = &r
	}
	res, err := rec.Call(ctx, req)
	if res != nil && res.Stale {
		return nil, t.stale()
	}
	return res, err
}

// Reset returns sandbox name to a clean state, as a new sandbox of its
// image (see Request.Reset), once the calls running in it have finished.
func (m *Manager) Reset(ctx context.Context, name string) error { return m.reset(ctx, named(name)) }

func (m *Manager) reset(ctx context.Context, t target) error {
	req, err := Request{Language: Shell, Reset: true}.wire()
	if err != nil {
		return err
	}
	res, err := m.callChecked(ctx, t, req, nil)
	if err != nil {
		return err
	}
	if res.Error != "" {
		return fmt.Errorf("reset sandbox %q: %s: %w", t.name, res.Error, errdefs.ErrUnknown)
	}
	return nil
}

// RunOnce runs req in a clean sandbox made from spec (Acquire: one of the
// pool of spec's shape, or a new one) and returns as Call does as soon as the
// call ends; the sandbox is given back in the background (Release: reset into
// its pool, or removed), which Close and Wait wait for, and whose failure is
// only logged (WithWarnf): the next Acquire makes a new sandbox. An
// interrupted call (ctx cancelled while the snippet runs) returns what the
// snippet printed so far with ErrInterrupted, as Call does. The sandbox is
// ephemeral (Spec.Ephemeral): if this process is killed first, Reconcile
// removes it.
func (m *Manager) RunOnce(ctx context.Context, spec Spec, req Request) (*Result, error) {
	wreq, err := req.wire()
	if err != nil {
		return nil, err
	}
	if req.Reset {
		return nil, fmt.Errorf("run once: a new sandbox is clean already (Reset): %w", errdefs.ErrInvalidArgument)
	}
	spec.Ephemeral = true
	sb, err := m.Acquire(ctx, spec)
	if err != nil {
		return nil, err
	}
	t := sb.target()
	var res *wire.Result
	if err = m.copyIn(ctx, t, req.CopyIn); err == nil {
		res, err = m.callChecked(ctx, t, wreq, req.Callback)
	}
	m.afterwards(func(ctx context.Context) {
		if err := m.release(ctx, t); err != nil {
			m.o.warnf("%v", err)
		}
	})
	return publicResult(t, wreq, res, err)
}

// callable reads the record of sandbox name, if it takes calls (and
// copies): a suspend or resume a killed flmbox left half done is ended
// first.
func (m *Manager) callable(ctx context.Context, name string) (*record.Record, error) {
	return m.callableAs(ctx, named(name))
}

// callableAs is callable for t: a record not of t's holding fails (see
// target.check).
func (m *Manager) callableAs(ctx context.Context, t target) (*record.Record, error) {
	rec, err := record.Read(m.root, t.name)
	if err != nil {
		return nil, err
	}
	if err := t.check(rec); err != nil {
		return nil, err
	}
	if err := rec.Callable(); err != nil {
		return m.callableAfterStale(ctx, rec, err)
	}
	return rec, nil
}

// callableAfterStale returns the record of a sandbox that rec said was not
// callable (err) after ending what a killed or failed flmbox left of a
// suspend or resume (its lock free): a record never stays suspending or
// resuming until some other command reconciles it. Otherwise err.
func (m *Manager) callableAfterStale(ctx context.Context, rec *record.Record, err error) (*record.Record, error) {
	if rec.State != record.Suspending && rec.State != record.Resuming {
		return nil, err
	}
	l, lerr := tryLock(rec.Dir)
	if lerr != nil {
		return nil, err // at work
	}
	defer l.Unlock()
	now, rerr := record.Read(m.root, rec.Name)
	if rerr != nil {
		return nil, rerr
	}
	if rerr := m.endStale(ctx, now); rerr != nil {
		return nil, fmt.Errorf("call sandbox %q: %w", rec.Name, rerr)
	}
	return now, now.Callable()
}
