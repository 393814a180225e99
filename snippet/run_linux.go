package snippet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// drainGrace bounds how long Run keeps reading output once the snippet's
// process exited and its process group was killed. The pipes normally reach
// EOF at once; only a process that left the group (setsid) can hold them
// open, and Run does not wait for it.
const drainGrace = 500 * time.Millisecond

// Run runs one snippet and returns its result; it is what Serve does for
// each connection. It never panics on a bad request and always returns a
// Result: a request that Validate refuses, a missing interpreter or a failure
// to start give ExitCode -1 and Error.
//
// The snippet runs until it exits, its timeout expires or ctx is done; then
// the rest of its process group is killed with SIGKILL. On timeout, TimedOut
// is set and ExitCode is the killed process's (137). When ctx is done first,
// the snippet is killed and the Result has ExitCode -1, Error saying so, and
// the output captured until then.
func (a *Agent) Run(ctx context.Context, req *Request) *Result {
	a.init()
	if err := req.Validate(); err != nil {
		return errorResult(err)
	}
	if err := context.Cause(ctx); err != nil {
		return errorResult(fmt.Errorf("run snippet: %w", err))
	}
	var path string
	var c command
	switch req.Language {
	case LanguagePython:
		if a.pythonErr != nil {
			return errorResult(a.pythonErr)
		}
		path, c = a.python, pythonCommand(req.Code)
		c.args[0] = path // Python finds its prefix from argv[0]
	case LanguageShell:
		path, c = a.shell, shellCommand(req.Code)
		c.args[0] = filepath.Base(path) // $0, and bash's POSIX mode only as sh
	}
	return a.run(ctx, req, path, c)
}

// pipes are the snippet's ends and the agent's ends of its three pipes.
type pipes struct {
	outR, outW, errR, errW, gateR, gateW *os.File
}

func newPipes() (*pipes, error) {
	var p pipes
	for _, pair := range [][2]**os.File{{&p.outR, &p.outW}, {&p.errR, &p.errW}, {&p.gateR, &p.gateW}} {
		r, w, err := os.Pipe()
		if err != nil {
			p.close()
			return nil, fmt.Errorf("create pipes for the snippet: %w", err)
		}
		*pair[0], *pair[1] = r, w
	}
	return &p, nil
}

// closeChildEnds closes the ends that only the snippet uses.
func (p *pipes) closeChildEnds() {
	for _, f := range []*os.File{p.outW, p.errW, p.gateR} {
		if f != nil {
			f.Close()
		}
	}
}

func (p *pipes) close() {
	p.closeChildEnds()
	for _, f := range []*os.File{p.outR, p.errR, p.gateW} {
		if f != nil {
			f.Close()
		}
	}
}

func (a *Agent) run(ctx context.Context, req *Request, path string, c command) *Result {
	stdout, stderr := newCapture(req.maxOutput()), newCapture(req.maxOutput())
	res := &Result{Version: ProtocolVersion, ExitCode: -1}
	finish := func(err error) *Result {
		res.Stdout, res.Stderr = stdout.Output(), stderr.Output()
		if err != nil {
			res.ExitCode, res.Signal, res.Error = -1, "", err.Error()
		}
		return res
	}
	p, err := newPipes()
	if err != nil {
		return finish(err)
	}
	defer p.close()
	cmd := &exec.Cmd{
		Path:        path,
		Args:        c.args,
		Dir:         a.dir,
		Env:         a.env,
		Stdout:      p.outW, // *os.File: the child gets the pipe itself, no copying goroutine
		Stderr:      p.errW,
		ExtraFiles:  []*os.File{p.gateR}, // fd 3 (gateFD)
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	var startErr error
	start := time.Now()
	pid := startChild(func() int {
		if startErr = cmd.Start(); startErr != nil {
			return 0
		}
		return cmd.Process.Pid
	})
	p.closeChildEnds()
	if startErr != nil {
		return finish(fmt.Errorf("start %s in %s: %w", path, a.dir, startErr))
	}

	var readers sync.WaitGroup
	readers.Go(func() { capturePipe(stdout, p.outR) })
	readers.Go(func() { capturePipe(stderr, p.errR) })
	exited := make(chan struct{})
	go func() {
		waitExited(pid)
		close(exited)
	}()

	// The interpreter blocks reading the gate: no snippet code runs before
	// the limits are set.
	var gate sync.WaitGroup
	limitErr := setLimits(pid, req.Limits)
	if limitErr == nil {
		gate.Go(func() {
			p.gateW.Write(c.gate) // fails only if the snippet died: its status says why
			p.gateW.Close()
		})
	}

	var cancelErr error
	timer := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
	defer timer.Stop()
	switch {
	case limitErr != nil:
		killGroup(pid)
		<-exited
	default:
		select {
		case <-exited:
		case <-timer.C:
			res.TimedOut = true
			killGroup(pid)
			<-exited
		case <-ctx.Done():
			cancelErr = fmt.Errorf("snippet cancelled and killed: %w", context.Cause(ctx))
			killGroup(pid)
			<-exited
		}
	}
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000

	// The exited process is a zombie until cmd.Wait reaps it, so its pid
	// still names its process group: kill what is left of the group now,
	// before the pid can be reused.
	killGroup(pid)
	waitErr := cmd.Wait()
	forgetChild(pid)

	p.drain(&readers)
	p.gateW.SetWriteDeadline(time.Unix(1, 0))
	gate.Wait()

	switch {
	case limitErr != nil:
		return finish(limitErr)
	case cancelErr != nil:
		return finish(cancelErr)
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return finish(fmt.Errorf("wait for the snippet: %w", waitErr))
	}
	res.ExitCode, res.Signal, err = exitStatus(cmd.ProcessState)
	return finish(err)
}

// drain waits for the readers of the output pipes to reach EOF, or stops
// them after drainGrace.
func (p *pipes) drain(readers *sync.WaitGroup) {
	drained := make(chan struct{})
	go func() {
		readers.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		p.outR.SetReadDeadline(time.Unix(1, 0))
		p.errR.SetReadDeadline(time.Unix(1, 0))
		<-drained
	}
}

// exitStatus returns a process's exit status, or 128+N and the signal's name
// if signal N killed it.
func exitStatus(ps *os.ProcessState) (int, string, error) {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case !ok:
		return -1, "", fmt.Errorf("wait for the snippet: no exit status")
	case ws.Signaled():
		return 128 + int(ws.Signal()), unix.SignalName(ws.Signal()), nil
	}
	return ws.ExitStatus(), "", nil
}

// capturePipe reads r into c until EOF or until r's read deadline passes.
func capturePipe(c *capture, r *os.File) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		c.Write(buf[:n])
		if err != nil {
			return
		}
	}
}

// waitExited returns when process pid has exited, without reaping it.
func waitExited(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// killGroup kills every process of the process group pgid.
func killGroup(pgid int) {
	unix.Kill(-pgid, unix.SIGKILL)
}

// setLimits sets the request's limits on process pid, both soft and hard so
// that the snippet cannot raise them. A limit above the hard limit that pid
// inherited from the agent is lowered to it.
func setLimits(pid int, l Limits) error {
	for _, lim := range []struct {
		resource int
		value    int64
		name     string
	}{
		{unix.RLIMIT_AS, l.MemoryBytes, "memory (RLIMIT_AS)"},
		{unix.RLIMIT_NPROC, l.Procs, "processes (RLIMIT_NPROC)"},
		{unix.RLIMIT_FSIZE, l.FileBytes, "file size (RLIMIT_FSIZE)"},
	} {
		if lim.value == 0 {
			continue
		}
		var own unix.Rlimit
		if err := unix.Getrlimit(lim.resource, &own); err != nil {
			return fmt.Errorf("read the agent's %s limit: %w", lim.name, err)
		}
		v := min(uint64(lim.value), own.Max)
		if err := unix.Prlimit(pid, lim.resource, &unix.Rlimit{Cur: v, Max: v}, nil); err != nil {
			return fmt.Errorf("set the snippet's %s limit to %d: %w", lim.name, v, err)
		}
	}
	return nil
}
