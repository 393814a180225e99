package snippet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
	"golang.org/x/sys/unix"
)

// zygote is a running Python zygote (see pythonZygote): the agent sends it
// a request per Python process, with the process's pipes, on a
// SOCK_SEQPACKET socket pair; the zygote forks, answers with the child's
// pid, reports the child's wait status once it has exited, and reaps it
// when the agent says so (see pythonZygote).
type zygote struct {
	conn    *net.UnixConn
	process *os.Process

	mu    sync.Mutex
	next  int
	forks map[int]*zygoteFork // requests waiting for their answer, by ID
	procs map[int]*proc       // children not yet reaped, by pid
	err   error               // why the zygote is gone; nil while it runs
}

type zygoteFork struct {
	p    *proc
	done chan error
}

// errZygoteClosed is why a closed zygote's children failed.
var errZygoteClosed = errors.New("the agent is stopping")

// startZygote starts a zygote. It takes requests at once; they wait in its
// socket while the interpreter starts.
func (a *Agent) startZygote() (*zygote, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("start the Python zygote: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "zygote"), os.NewFile(uintptr(fds[1]), "zygote")
	defer theirs.Close()
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("start the Python zygote: %w", err)
	}
	c := zygoteCommand(a.User)
	c.args[0] = a.python
	// Its stderr is /dev/null: the zygote runs as the snippets' user, who
	// could write to anything it holds open (the agent's own stderr is a
	// file on the host's disk).
	cmd := &exec.Cmd{Path: a.python, Args: c.args, Dir: a.workDir, Env: a.pyEnv,
		ExtraFiles: []*os.File{theirs}} // fd 3
	pid, startErr := startChild(cmd)
	if startErr != nil {
		conn.Close()
		return nil, fmt.Errorf("start the Python zygote %s: %w", a.python, startErr)
	}
	z := &zygote{conn: conn.(*net.UnixConn), process: cmd.Process, forks: map[int]*zygoteFork{}, procs: map[int]*proc{}}
	go z.read()
	go func() {
		err := cmd.Wait()
		forgetChild(pid)
		z.fail(fmt.Errorf("the Python zygote exited (%v)", err))
	}()
	return z, nil
}

// fork asks the zygote for a Python process with limits, and a pipe for
// its stdin if stdin is set (else it has the zygote's, /dev/null).
func (z *zygote) fork(limits wire.Limits, stdin bool) (*proc, error) {
	pp, err := newPipes(stdin)
	if err != nil {
		return nil, err
	}
	f := &zygoteFork{p: pp.proc(pythonCommand(nil, true), limits), done: make(chan error, 1)} // only its gate matters
	z.mu.Lock()
	if z.err != nil {
		z.mu.Unlock()
		pp.close()
		return nil, z.err
	}
	id := z.next
	z.next++
	z.forks[id] = f
	z.mu.Unlock()
	msg := fmt.Appendf(nil, "F %d %d %d", id, limits.Procs, limits.FileBytes)
	fds := []int{int(pp.outW.Fd()), int(pp.errW.Fd()), int(pp.gateR.Fd())}
	if pp.inR != nil {
		fds = append(fds, int(pp.inR.Fd()))
	}
	oob := unix.UnixRights(fds...)
	_, _, err = z.conn.WriteMsgUnix(msg, oob, nil)
	pp.closeChildEnds() // the zygote has its own copies now
	if err != nil {
		z.fail(fmt.Errorf("send a request to the Python zygote: %w", err))
	}
	select {
	case err = <-f.done:
	case <-time.After(zygoteDeadline):
		// A zygote starved of CPU, or stopped where it runs as the
		// snippets' user (no Agent.User): give up on it.
		z.kill(fmt.Errorf("the Python zygote did not answer within %s", zygoteDeadline))
		err = <-f.done
	}
	if err != nil {
		f.p.close()
		return nil, err
	}
	f.p.abandon = func() {
		z.kill(fmt.Errorf("the Python zygote did not report a killed snippet within %s", zygoteDeadline))
	}
	return f.p, nil
}

// zygoteDeadline bounds how long the agent waits for the zygote: to fork,
// and to report a child the agent killed. A zygote that takes longer (a
// snippet stopped it) is killed, with its children.
const zygoteDeadline = 5 * time.Second

// kill fails the zygote with err and kills its process.
func (z *zygote) kill(err error) {
	z.fail(err)
	z.conn.Close()
	z.process.Kill()
}

// read handles the zygote's messages until it is gone.
func (z *zygote) read() {
	buf := make([]byte, 512)
	for {
		n, err := z.conn.Read(buf)
		if err != nil || n == 0 {
			z.fail(fmt.Errorf("the Python zygote is gone (%v)", err))
			return
		}
		if err := z.handle(strings.Fields(string(buf[:n]))); err != nil {
			z.fail(err)
			z.conn.Close()
			return
		}
	}
}

func (z *zygote) handle(msg []string) error {
	if len(msg) < 3 {
		return fmt.Errorf("the Python zygote said %q", msg)
	}
	n, err := strconv.Atoi(msg[1])
	if err != nil {
		return fmt.Errorf("the Python zygote said %q", msg)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	switch msg[0] {
	case "P": // forked: ID PID
		pid, err := strconv.Atoi(msg[2])
		f := z.forks[n]
		if err != nil || f == nil || pid <= 0 {
			return fmt.Errorf("the Python zygote said %q", msg)
		}
		delete(z.forks, n)
		f.p.pid = pid
		z.procs[pid] = f.p
		f.done <- nil
	case "E": // failed: ID ERROR
		f := z.forks[n]
		if f == nil {
			return fmt.Errorf("the Python zygote said %q", msg)
		}
		delete(z.forks, n)
		f.done <- fmt.Errorf("start a Python process in the zygote: %s", strings.Join(msg[2:], " "))
	case "X": // exited: PID STATUS
		status, err := strconv.ParseUint(msg[2], 10, 32)
		if err != nil {
			return fmt.Errorf("the Python zygote said %q", msg)
		}
		p := z.procs[n]
		if p == nil {
			// A child the zygote did not fork for a request: a snippet
			// gave it one with clone(CLONE_PARENT), and the stray sweep
			// killed it. Nothing waits for it.
			return nil
		}
		p.end(unix.WaitStatus(status), nil)
		go p.linger(func() { z.reap(p) })
	default:
		return fmt.Errorf("the Python zygote said %q", msg)
	}
	return nil
}

// fail records that the zygote is gone: the requests waiting fail, and the
// children still running are killed and fail.
func (z *zygote) fail(err error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.err != nil {
		return
	}
	z.err = err
	for id, f := range z.forks {
		delete(z.forks, id)
		f.done <- err
	}
	for pid, p := range z.procs {
		delete(z.procs, pid)
		p.sigkill()
		p.setReaped(nil) // the agent reaps it as an orphan, at any time now
		p.end(0, fmt.Errorf("run the snippet: %w", err))
		p.cutGrace()
		p.finish()
	}
}

// reap has the zygote reap p, its child that has exited, once linger has
// killed the rest of p's group.
func (z *zygote) reap(p *proc) {
	p.setReaped(nil) // from here on its pid is not the agent's to signal
	z.mu.Lock()
	delete(z.procs, p.pid)
	gone := z.err != nil
	z.mu.Unlock()
	if !gone {
		// Fails only if the zygote is gone: its children are then orphans
		// that the agent reaps.
		z.conn.Write(fmt.Appendf(nil, "R %d", p.pid))
	}
}

func (z *zygote) alive() bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.err == nil
}

// close stops the zygote and its children.
func (z *zygote) close() {
	z.kill(errZygoteClosed)
}
