package snippet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
	"golang.org/x/sys/unix"
)

// Run runs one snippet and returns its result; it is what Serve does for
// each connection. It never panics on a bad request and always returns a
// Result: a request that Validate refuses, a missing interpreter or a failure
// to start give ExitCode -1 and Error.
//
// The snippet runs until it exits, its timeout expires or ctx is done. Its
// Result is what its process printed until then and how it ended; the rest
// of its process group is killed with SIGKILL, at once if the snippet was
// killed, else after a grace that the answer does not wait for (see
// proc.linger). On timeout, TimedOut
// is set and ExitCode is the killed process's (137). When ctx is done first,
// the snippet is killed and the Result has ExitCode -1, Error saying so, and
// the output captured until then.
func (a *Agent) Run(ctx context.Context, req *wire.Request) *wire.Result {
	res, ran := a.run(ctx, req, nil)
	a.afterCall(req, ran)
	return res
}

// run is Run without starting the next spare; ran says that a process ran
// req's code, so that one should be started. notify sends the call's events
// to its client (nil: the call can have no Callback).
func (a *Agent) run(ctx context.Context, req *wire.Request, notify func(wire.Event) error) (res *wire.Result, ran bool) {
	a.init()
	if req != nil && req.Ping {
		return &wire.Result{Version: wire.ProtocolVersion}, false
	}
	if err := req.Validate(); err != nil {
		return errorResult(err), false
	}
	if err := context.Cause(ctx); err != nil {
		res := errorResult(fmt.Errorf("run snippet: %w", err))
		res.Interrupted = errors.Is(err, errInterrupted)
		return res, false
	}
	if req.Language == wire.LanguagePython && req.Interpreter == "" && a.pythonErr != nil {
		return errorResult(a.pythonErr), false
	}
	if err := a.keyrings.wait(ctx); err != nil {
		return errorResult(fmt.Errorf("run snippet: %w", err)), false
	}
	if req.Reset {
		if stale, err := a.resetAs(ctx, req.HandOut, req.NewHandOut); stale != nil {
			return stale, false
		} else if err != nil {
			return errorResult(err), false
		}
	}
	interp, err := a.interpreter(req)
	if err != nil {
		return errorResult(err), false
	}
	// call is req as run: a shell's code exports the call's own settings
	// (late), which a Python process takes from its gate; with a File, its
	// File is the code file's path, and a shell's code is the agent's shell
	// exec'ing the interpreter on it (interp is then the agent's).
	call, late := req, []string(nil)
	var cb *callback
	if req.Callback != nil {
		if cb, late, err = a.openCallback(req.Callback, notify); err != nil {
			return errorResult(err), false
		}
		defer func() {
			if stats := cb.close(); res != nil {
				res.Callbacks = stats
			}
		}()
		defer func() { cb.root.Store(0) }() // before it closes: its connections' processes are gone
	}
	if req.File != "" || len(late) > 0 {
		c := *req
		code := req.Code
		if req.File != "" {
			var remove func()
			if c.File, remove, err = a.writeCode(req); err != nil {
				return errorResult(err), false
			}
			defer remove()
			if req.Language == wire.LanguagePython {
				late = append(late, "="+c.File) // the bootstrap's name for the file
			} else {
				code = shellRunFile(cmp.Or(interp, a.shell), c.File)
				interp = ""
			}
		}
		if req.Language == wire.LanguageShell {
			c.Code = shellExports(late) + code
		}
		call = &c
	}
	a.sweepStrays() // if the last call's own sweep has not run yet
	a.calls.RLock()
	defer a.calls.RUnlock()
	if stale := a.staleResult(req.HandOut); stale != nil {
		return stale, false
	}
	var p *proc
	if interp == "" && len(req.Env) == 0 && len(req.Stdin) == 0 {
		p = a.takeSpare(ctx, call)
	}
	if p == nil {
		if p, err = a.startCall(call, interp); err != nil {
			return errorResult(err), false
		}
	}
	if cb != nil {
		cb.root.Store(int64(p.pid)) // before any of its code runs
	}
	res = a.runProc(ctx, call, late, p)
	a.leftovers.Store(true) // before the answer: the next call must see it
	return res, true
}

// interpreter returns the path of req's Interpreter, or "" if it names the
// language's own (or none).
func (a *Agent) interpreter(req *wire.Request) (string, error) {
	name := req.Interpreter
	if name == "" || req.Language == wire.LanguagePython && name == "python" {
		return "", nil
	}
	env := withEnv(a.env, req.Env)
	if cmd := wire.PythonVersion(name); cmd != "" && req.Language == wire.LanguagePython {
		name = cmd
	}
	var path string
	var err error
	if strings.HasPrefix(name, "/") {
		path, err = executable(name)
	} else {
		path, err = lookPath(name, env)
	}
	switch {
	case err != nil && name != req.Interpreter:
		return "", missing{fmt.Errorf("interpreter %s: the sandbox has no %s in its PATH; %s", req.Interpreter, name, pythonsIn(env))}
	case err != nil:
		return "", missing{fmt.Errorf("interpreter %s: the sandbox has none: %w", req.Interpreter, err)}
	}
	own := a.shell
	if req.Language == wire.LanguagePython {
		own = a.python
	}
	if sameFile(path, own) {
		return "", nil
	}
	return path, nil
}

// executable returns path if it is an executable file.
func executable(path string) (string, error) {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return "", err
	case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
		return "", fmt.Errorf("%s is not an executable file", path)
	}
	return path, nil
}

// pythonsIn says which Python 3 commands (python3, python3.N) the PATH of
// env has.
func pythonsIn(env []string) string {
	path, _ := lookEnv(env, "PATH")
	var found []string
	for _, dir := range filepath.SplitList(path) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if n := e.Name(); (n == "python3" || wire.PythonVersion(strings.TrimPrefix(n, "python")) != "") && !slices.Contains(found, n) {
				if _, err := executable(filepath.Join(dir, n)); err == nil {
					found = append(found, n)
				}
			}
		}
	}
	if len(found) == 0 {
		return "it has no Python 3 there"
	}
	slices.Sort(found)
	return "it has " + strings.Join(found, ", ")
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// withEnv is env with the settings of extra added; a later one of a name
// wins.
func withEnv(env, extra []string) []string {
	if len(extra) == 0 {
		return env
	}
	set := make(map[string]bool, len(extra))
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	out := make([]string, 0, len(env)+len(extra))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	for i, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(extra[i+1:], func(later string) bool { return strings.HasPrefix(later, k+"=") }) {
			out = append(out, kv)
		}
	}
	return out
}

// startCall starts the process of req (a call: File is a path), which
// takes no spare: one with stdin is started as any (forked by the zygote if
// one runs); one with its own interpreter (interp) or environment is exec'd
// as the snippets' user, so that neither runs as the agent's.
func (a *Agent) startCall(req *wire.Request, interp string) (*proc, error) {
	stdin := len(req.Stdin) > 0
	if interp == "" && len(req.Env) == 0 {
		return a.start(req.Language, req.Code, req.Limits, false, stdin, false)
	}
	runs, idle := a.spareMark()
	env := withEnv(a.env, req.Env)
	var p *proc
	var err error
	if req.Language == wire.LanguagePython {
		path := cmp.Or(interp, a.python)
		c := pythonCommand(nil, interp == "")
		c.args[0] = path
		p, err = a.startExec(path, c, pythonEnv(env), a.User.credential(), req.Limits, stdin)
	} else {
		path := cmp.Or(interp, a.shell)
		c := shellCommand(req.Code)
		c.args[0] = filepath.Base(path)
		p, err = a.startExec(path, c, env, a.User.credential(), req.Limits, stdin)
	}
	if err == nil {
		p.lang, p.runs, p.idleStart = req.Language, runs, idle
	}
	return p, err
}

// proc is a snippet's process, started with its limits set and blocked on
// its gate: none of the snippet's code has run yet.
type proc struct {
	pid    int
	lang   string
	cmd    command
	limits wire.Limits
	// runs and idleStart are the agent's spareMark when p started.
	runs      int64
	idleStart bool
	// pristine: a python3 that the agent started as a spare (not a fork of
	// the zygote), which a reset may keep (see Reset).
	pristine          bool
	outR, errR, gateW *os.File
	// stdinW, if not nil, is the write end of the process's stdin.
	stdinW *os.File
	// ended is closed once the process has exited (it is not reaped yet:
	// the rest of its group may run on, see linger); then status, or err,
	// says how it ended.
	ended   chan struct{}
	endOnce sync.Once
	status  unix.WaitStatus
	err     error
	// done is closed once the process has exited, the rest of its process
	// group has been killed and it has been reaped.
	done     chan struct{}
	doneOnce sync.Once
	// cut, closed by kill, ends linger's grace at once; quiet is closed
	// once the process's output pipes reached their end: no process of its
	// group holds them any more (see output).
	cut      chan struct{}
	cutOnce  sync.Once
	quiet    chan struct{}
	output   *output // the pipes' readers once a call runs p
	outputMu sync.Mutex
	// abandon, if set, ends a process that was killed but whose end is
	// not reported (its zygote is stuck): it closes done.
	abandon func()
	// oomKilled says that the memory watch killed it.
	oomKilled atomic.Bool
	// reaped says that the process was reaped: its pid may name another
	// process now, which sigkill must not touch.
	reapMu sync.Mutex
	reaped bool
}

// end records how p ended, once, and closes ended.
func (p *proc) end(status unix.WaitStatus, err error) {
	p.endOnce.Do(func() {
		p.status, p.err = status, err
		close(p.ended)
	})
}

// finish closes done, once.
func (p *proc) finish() { p.doneOnce.Do(func() { close(p.done) }) }

// cutGrace ends linger's grace, if any, at once.
func (p *proc) cutGrace() { p.cutOnce.Do(func() { close(p.cut) }) }

// setReaped records that p was reaped; do, if not nil, runs first under the
// same lock (the reaping itself, for a child of the agent).
func (p *proc) setReaped(do func()) {
	p.reapMu.Lock()
	defer p.reapMu.Unlock()
	if do != nil {
		do()
	}
	p.reaped = true
}

// sigkill kills p's process group and p itself, which may have left its
// group (setpgid), unless p was reaped already.
func (p *proc) sigkill() {
	p.reapMu.Lock()
	defer p.reapMu.Unlock()
	if p.reaped {
		return
	}
	killGroup(p.pid)
	if p.pid > 0 {
		unix.Kill(p.pid, unix.SIGKILL)
	}
}

// kill kills p as sigkill does, with no grace for the rest of its group,
// and waits until p is done.
func (p *proc) kill() {
	p.cutGrace()
	p.sigkill()
	if p.abandon == nil {
		<-p.done
		return
	}
	select {
	case <-p.done:
	case <-time.After(zygoteDeadline):
		p.abandon()
		<-p.done
	}
}

// fits says whether p can run code: sh -s takes small code only.
func (p *proc) fits(code string) bool {
	return !p.cmd.stdinGate || len(code) <= maxShellScript
}

// exited says whether p is done: it has exited and the rest of its group
// is killed.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// running says whether p has not exited.
func (p *proc) running() bool {
	select {
	case <-p.ended:
		return false
	default:
		return true
	}
}

// discard kills an unused process and releases it.
func (p *proc) discard() {
	go func() {
		p.kill()
		p.close()
	}()
}

func (p *proc) close() {
	for _, f := range []*os.File{p.outR, p.errR, p.gateW, p.stdinW} {
		if f != nil {
			f.Close()
		}
	}
}

// start starts the interpreter of lang for code (empty for a spare, which
// takes code later), with limits set, and a pipe for its stdin if stdin is
// set (else stdin is at EOF). A Python process is forked by the zygote when the agent has
// one running, or when wait is set after starting one; otherwise it is a
// new python3, unless spare is set (refill's) and a reset began: the
// zygote's fork failed because the reset killed it, and would drop the
// python3 too.
func (a *Agent) start(lang, code string, limits wire.Limits, wait, stdin, spare bool) (*proc, error) {
	runs, idle := a.spareMark()
	p, err := a.startLang(lang, code, limits, wait, stdin, spare)
	if err == nil {
		p.lang, p.runs, p.idleStart = lang, runs, idle
	}
	return p, err
}

func (a *Agent) startLang(lang, code string, limits wire.Limits, wait, stdin, spare bool) (*proc, error) {
	if lang == wire.LanguageShell {
		c := shellScriptCommand()
		if len(code) > maxShellScript || !a.shellIsDash || stdin { // sh -s's stdin is its gate
			c = shellCommand(code)
		}
		c.args[0] = filepath.Base(a.shell) // $0, and bash's POSIX mode only as sh
		return a.startExec(a.shell, c, a.env, a.User.credential(), limits, stdin)
	}
	if z := a.zygote(wait); z != nil {
		p, err := z.fork(limits, stdin)
		if err == nil {
			return p, nil
		}
		if spare && a.resets.Load() > 0 {
			return nil, err
		}
	}
	c := pythonCommand(a.User, true)
	c.args[0] = a.python                                            // Python finds its prefix from argv[0]
	p, err := a.startExec(a.python, c, a.pyEnv, nil, limits, stdin) // it becomes a.User itself
	if err == nil {
		p.pristine = spare && !stdin
	}
	return p, err
}

// pipes are the snippet's ends and the agent's ends of its pipes: stdout,
// stderr, the gate, and stdin if asked for.
type pipes struct {
	outR, outW, errR, errW, gateR, gateW, inR, inW *os.File
}

func newPipes(stdin bool) (*pipes, error) {
	var p pipes
	pairs := []struct {
		own, child **os.File
		ownReads   bool
	}{{&p.outR, &p.outW, true}, {&p.errR, &p.errW, true}, {&p.gateW, &p.gateR, false}}
	if stdin {
		pairs = append(pairs, struct {
			own, child **os.File
			ownReads   bool
		}{&p.inW, &p.inR, false})
	}
	for _, pair := range pairs {
		own, child, err := pipe(pair.ownReads)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("create pipes for the snippet: %w", err)
		}
		*pair.own, *pair.child = own, child
	}
	return &p, nil
}

// pipe returns a pipe's two ends: the agent's, non-blocking and in Go's
// poller (its reads and writes take deadlines), and the snippet's, blocking
// and outside it. os.Pipe would put both in the poller, and os/exec would
// then make the snippet's end blocking again: a dozen system calls more per
// snippet, each costly under gVisor.
func pipe(ownReads bool) (own, child *os.File, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	ownFD, childFD := fds[0], fds[1]
	if !ownReads {
		ownFD, childFD = fds[1], fds[0]
	}
	if err := unix.SetNonblock(ownFD, true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(ownFD), "|0"), os.NewFile(uintptr(childFD), "|1"), nil
}

// closeChildEnds closes the ends that only the snippet uses.
func (p *pipes) closeChildEnds() {
	for _, f := range []*os.File{p.outW, p.errW, p.gateR, p.inR} {
		if f != nil {
			f.Close()
		}
	}
}

func (p *pipes) close() {
	p.closeChildEnds()
	for _, f := range []*os.File{p.outR, p.errR, p.gateW, p.inW} {
		if f != nil {
			f.Close()
		}
	}
}

// proc returns the agent's ends of p as a process's.
func (p *pipes) proc(c command, limits wire.Limits) *proc {
	return &proc{cmd: c, limits: limits, outR: p.outR, errR: p.errR, gateW: p.gateW, stdinW: p.inW,
		ended: make(chan struct{}), done: make(chan struct{}), cut: make(chan struct{}), quiet: make(chan struct{})}
}

// startExec starts c as a child of the agent, in its own process group,
// with env, as user cred (nil: the agent's), with a pipe for its stdin if
// stdin is set, and sets its limits.
func (a *Agent) startExec(path string, c command, env []string, cred *syscall.Credential, limits wire.Limits, stdin bool) (*proc, error) {
	pp, err := newPipes(stdin)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        c.args,
		Dir:         a.workDir,
		Env:         env,
		Stdout:      pp.outW, // *os.File: the child gets the pipe itself, no copying goroutine
		Stderr:      pp.errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	}
	switch {
	case c.stdinGate:
		cmd.Stdin = pp.gateR
	case pp.inR != nil:
		cmd.Stdin = pp.inR
		fallthrough
	default:
		cmd.ExtraFiles = []*os.File{pp.gateR} // fd 3 (gateFD)
	}
	pid, startErr := startChild(cmd)
	pp.closeChildEnds()
	if startErr != nil {
		pp.close()
		if _, err := os.Stat(path); errors.Is(startErr, fs.ErrNotExist) && errors.Is(err, fs.ErrNotExist) {
			return nil, missing{fmt.Errorf("the image has no %s, which runs this snippet: %w", path, startErr)}
		}
		return nil, fmt.Errorf("start %s in %s: %w", path, a.workDir, startErr)
	}
	p := pp.proc(c, limits)
	p.pid = pid
	go func() {
		// The exited process is a zombie until cmd.Wait reaps it, so its pid
		// still names its process group while linger runs: kill what is
		// left of the group before reaping it, before the pid can be reused.
		status, err := waitEnded(pid)
		if err != nil {
			err = fmt.Errorf("wait for the snippet: %w", err)
		}
		p.end(status, err)
		p.linger(func() {
			p.setReaped(func() { cmd.Wait() })
			forgetChild(pid)
		})
	}()
	// The interpreter blocks reading the gate: no snippet code runs before
	// the limits are set.
	if err := setLimits(pid, limits); err != nil {
		p.kill()
		p.close()
		return nil, err
	}
	return p, nil
}

// runProc gives req's code, and the call's settings late, to p through its
// gate and collects the result.
func (a *Agent) runProc(ctx context.Context, req *wire.Request, late []string, p *proc) *wire.Result {
	defer p.closeInput()
	stdout, stderr := newCapture(req.OutputLimit()), newCapture(req.OutputLimit())
	res := &wire.Result{Version: wire.ProtocolVersion, ExitCode: -1}
	out := readOutput(p, stdout, stderr, a.memoryLow)

	start := time.Now()
	a.codeStarted()
	defer a.codeEnded()
	var gate sync.WaitGroup
	gate.Go(func() {
		p.gateW.Write(p.cmd.gateData(req.Code, late)) // fails only if the snippet died: its status says why
		p.gateW.Close()
		if p.stdinW != nil {
			p.stdinW.Write(req.Stdin) // fails if the snippet ended without reading it all, as a shell's would
			p.stdinW.Close()
		}
	})
	var cancelErr error
	timer := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
	defer timer.Stop()
	stopWatch := a.watchMemory(p, req.MemoryNudges)
	var timedOut, cancelled bool
	select {
	case <-p.ended:
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
		cancelled = true
	}
	switch {
	case timedOut:
		stopWatch()                        // before killing: what killed p is known from here on
		res.TimedOut = !p.oomKilled.Load() // or killed for memory, then timed out before it ended
		p.kill()
	case cancelled && errors.Is(context.Cause(ctx), errInterrupted):
		// As on timeout: its status (SIGKILL) and what it printed until then.
		stopWatch()
		res.Interrupted = true
		p.kill()
	case cancelled:
		stopWatch()
		cancelErr = fmt.Errorf("snippet cancelled and killed: %w", context.Cause(ctx))
		p.kill()
	default:
		// It exited by itself: the rest of its group lingers (see
		// proc.linger), while memory lasts.
		stopWatch()
		a.addLingering(p)
	}
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000

	out.catchUp()
	p.gateW.SetWriteDeadline(time.Unix(1, 0))
	if p.stdinW != nil {
		p.stdinW.SetWriteDeadline(time.Unix(1, 0))
	}
	gate.Wait()

	res.Stdout, res.Stderr = stdout.Output(), stderr.Output()
	err := cancelErr
	if err == nil {
		err = p.err
	}
	if err == nil {
		res.ExitCode, res.Signal = exitStatus(p.status)
		res.OOMKilled = p.oomKilled.Load() && res.Signal == "SIGKILL"
		return res
	}
	res.ExitCode, res.Signal, res.Error = -1, "", err.Error()
	return res
}

// closeInput closes the agent's ends of p's gate and stdin; its output
// pipes are its output's to close.
func (p *proc) closeInput() {
	for _, f := range []*os.File{p.gateW, p.stdinW} {
		if f != nil {
			f.Close()
		}
	}
}

// exitStatus returns a process's exit status, or 128+N and the signal's name
// if signal N killed it.
func exitStatus(ws unix.WaitStatus) (int, string) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), unix.SignalName(ws.Signal())
	}
	return ws.ExitStatus(), ""
}

// waitEnded returns when process pid has exited, without reaping it, with
// its wait status.
func waitEnded(pid int) (unix.WaitStatus, error) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		switch err {
		case unix.EINTR:
			continue
		case nil:
			return siginfoStatus(&info), nil
		}
		return 0, err
	}
}

// killGroup kills every process of the process group pgid.
func killGroup(pgid int) {
	if pgid > 0 {
		unix.Kill(-pgid, unix.SIGKILL)
	}
}

// setLimits sets the request's limits on process pid, both soft and hard so
// that the snippet cannot raise them. A limit above the hard limit that pid
// inherited from the agent is lowered to it.
func setLimits(pid int, l wire.Limits) error {
	for _, lim := range []struct {
		resource int
		value    int64
		name     string
	}{
		{unix.RLIMIT_NPROC, l.Procs, "processes (RLIMIT_NPROC)"},
		{unix.RLIMIT_FSIZE, l.FileBytes, "file size (RLIMIT_FSIZE)"},
	} {
		if lim.value == 0 {
			continue
		}
		own, err := ownLimit(lim.resource)
		if err != nil {
			return fmt.Errorf("read the agent's %s limit: %w", lim.name, err)
		}
		v := min(uint64(lim.value), own)
		if err := unix.Prlimit(pid, lim.resource, &unix.Rlimit{Cur: v, Max: v}, nil); err != nil {
			return fmt.Errorf("set the snippet's %s limit to %d: %w", lim.name, v, err)
		}
	}
	return nil
}

// ownLimits caches the agent's hard limits, which it never changes.
var ownLimits sync.Map // resource → uint64

// ownLimit returns the agent's hard limit of resource.
func ownLimit(resource int) (uint64, error) {
	if v, ok := ownLimits.Load(resource); ok {
		return v.(uint64), nil
	}
	var own unix.Rlimit
	if err := unix.Getrlimit(resource, &own); err != nil {
		return 0, err
	}
	ownLimits.Store(resource, own.Max)
	return own.Max, nil
}
