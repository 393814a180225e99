package snippet

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The end of a call.
//
// A call's answer is sent as soon as the snippet's process has exited (or
// was killed), with what its pipes held then (output.catchUp): the answer
// never waits for the rest of its process group. Killed snippets (a timeout,
// a cancelled or interrupted call, the memory watch) have their group killed
// at once. A snippet that exits by itself leaves its group a grace
// (proc.linger), for Python's resource tracker: multiprocessing's and
// loky's ignore SIGINT and SIGTERM and, once the processes that use them are
// gone, remove the shared memory segments and semaphores those leaked and
// warn about them; killed with the group, they left them in /dev/shm for
// the next calls.

// lingerMax bounds the grace of the rest of a snippet's process group once
// the snippet's process has exited by itself (see proc.linger).
const lingerMax = time.Second

// maxCatchUp bounds what output.catchUp reads of a pipe that processes
// still write to: more than a pipe can hold (1 MiB at most for a process
// that is not root), so that it takes all the snippet's process wrote.
const maxCatchUp = 4 << 20

// linger lets the rest of p's process group, once p has exited by itself,
// run on for a grace, then kills it, reaps p (reap) and closes done. The
// group gets SIGTERM, which ends what a call left behind (a shell's
// sleep 1000 &) unless it handles it; the grace ends as soon as no process
// of the group holds the output pipes any more (quiet: the resource tracker
// has them as its stdout and stderr), at lingerMax, when kill cuts it, or
// once the sandbox's memory runs low (the memory watch watches calls only).
// p's zombie keeps the group's ID from being taken until the group is
// killed. The stray sweep waits for it (Agent.waitLingering), a reset cuts
// it.
func (p *proc) linger(reap func()) {
	select {
	case <-p.cut:
	default:
		if p.pid > 0 {
			unix.Kill(-p.pid, unix.SIGTERM)
		}
		p.grace()
	}
	p.sigkill()
	reap()
	p.finish()
	if o := p.readers(); o != nil {
		o.stop() // pipes still held, by processes that left the group
	}
}

// grace waits until p's group no longer holds its output pipes, at most
// lingerMax, and no longer once kill cuts it, memory runs low, or the group
// is empty (processes out of it may hold the pipes).
func (p *proc) grace() {
	timer := time.NewTimer(lingerMax)
	defer timer.Stop()
	var memPolls <-chan time.Time
	if o := p.readers(); o != nil && o.memoryLow != nil {
		t := time.NewTicker(memPoll)
		defer t.Stop()
		memPolls = t.C
	}
	scans := time.NewTicker(lingerScan)
	defer scans.Stop()
	for {
		select {
		case <-p.quiet:
			return
		case <-p.cut:
			return
		case <-timer.C:
			return
		case <-memPolls:
			if p.readers().memoryLow() {
				return
			}
		case <-scans.C:
			if groupEmpty(p.pid) {
				return
			}
		}
	}
}

// lingerScan is how often linger's grace looks for the processes of the
// group over /proc, while they hold the output pipes: a process that left
// the group may hold them after the group is gone.
const lingerScan = 25 * time.Millisecond

// groupEmpty says whether process group pgid has no process but zombies
// and its leader, from /proc.
func groupEmpty(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	id := []byte(strconv.Itoa(pgid))
	for _, e := range ents {
		name := e.Name()
		if name[0] < '0' || name[0] > '9' || name == string(id) {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue // gone
		}
		// After the command's closing parenthesis: state, ppid, pgrp.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		if f := bytes.Fields(b[i+1:]); len(f) > 2 && bytes.Equal(f[2], id) && !bytes.Equal(f[0], []byte("Z")) {
			return false
		}
	}
	return true
}

// readers returns p's output, nil before a call ran it.
func (p *proc) readers() *output {
	p.outputMu.Lock()
	defer p.outputMu.Unlock()
	return p.output
}

// output reads a snippet's stdout and stderr into their captures while it
// runs. Once its process has exited, catchUp takes what the pipes hold then,
// without waiting for their end: processes of its group (during linger's
// grace) or out of it may hold them open. From then on they are read, and
// what comes dropped, until their end, which closes the process's quiet, or
// until stop; each pipe is closed once its reader is done with it.
type output struct {
	p     *proc
	pipes [2]*outPipe
	// memoryLow, if not nil, ends linger's grace.
	memoryLow func() bool

	mu       sync.Mutex
	stopping bool // stop was called: no tail starts
}

// outPipe is one output pipe of a snippet, the agent's end.
type outPipe struct {
	f       *os.File
	c       *capture
	buf     []byte
	stopped chan struct{} // closed once its reader returned
	eof     bool          // its reader reached the pipe's end
}

// readOutput starts reading p's output pipes into stdout and stderr;
// memoryLow, if not nil, ends linger's grace when it says so.
func readOutput(p *proc, stdout, stderr *capture, memoryLow func() bool) *output {
	o := &output{p: p, pipes: [2]*outPipe{{f: p.outR, c: stdout}, {f: p.errR, c: stderr}}, memoryLow: memoryLow}
	for _, op := range o.pipes {
		op.buf = make([]byte, 64<<10)
		op.stopped = make(chan struct{})
		go op.read(op.c)
	}
	p.outputMu.Lock()
	p.output = o
	p.outputMu.Unlock()
	return o
}

// read reads the pipe into c (nil: drops what it reads) until its end or an
// error, such as its read deadline passing.
func (op *outPipe) read(c *capture) {
	defer close(op.stopped)
	for {
		n, err := op.f.Read(op.buf)
		if c != nil {
			c.Write(op.buf[:n])
		}
		if err != nil {
			op.eof = err == io.EOF
			return
		}
	}
}

// readNow reads what the pipe holds into its capture, without waiting for
// more, and says whether it reached the pipe's end.
func (op *outPipe) readNow() (eof bool) {
	rc, err := op.f.SyscallConn()
	if err != nil {
		return false
	}
	// Control, not Read: a read deadline has passed.
	rc.Control(func(fd uintptr) {
		for total := 0; total < maxCatchUp; {
			n, err := unix.Read(int(fd), op.buf)
			switch {
			case err == unix.EINTR:
				continue
			case err != nil: // EAGAIN: nothing more now
				return
			case n == 0:
				eof = true
				return
			}
			op.c.Write(op.buf[:n])
			total += n
		}
	})
	return eof
}

// catchUp stops the readers and takes what the pipes hold now: everything
// the snippet's process wrote, since it has exited. A pipe at its end is
// closed; the others are read on (tail).
func (o *output) catchUp() {
	ended := 0
	for _, op := range o.pipes {
		op.f.SetReadDeadline(time.Unix(1, 0))
		<-op.stopped
		if !op.eof {
			op.eof = op.readNow()
		}
		if op.eof {
			op.f.Close()
			ended++
		}
	}
	if ended == len(o.pipes) {
		close(o.p.quiet)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stopping {
		o.closeAll()
		return
	}
	var tails []*outPipe
	for _, op := range o.pipes {
		if !op.eof {
			op.stopped = make(chan struct{})
			op.f.SetReadDeadline(time.Time{})
			go op.read(nil)
			tails = append(tails, op)
		}
	}
	go func() {
		quiet := true
		for _, op := range tails {
			<-op.stopped
			op.f.Close()
			quiet = quiet && op.eof
		}
		if quiet {
			close(o.p.quiet)
		}
	}()
}

// stop makes the pipes' readers return now.
func (o *output) stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stopping = true
	for _, op := range o.pipes {
		op.f.SetReadDeadline(time.Unix(1, 0)) // an error if it is closed
	}
}

func (o *output) closeAll() {
	for _, op := range o.pipes {
		op.f.Close()
	}
}

// addLingering records p, whose process exited by itself, until it is done:
// the stray sweep waits for it.
func (a *Agent) addLingering(p *proc) {
	a.lingerMu.Lock()
	defer a.lingerMu.Unlock()
	for q := range a.lingering {
		if q.exited() {
			delete(a.lingering, q)
		}
	}
	if a.lingering == nil {
		a.lingering = map[*proc]struct{}{}
	}
	a.lingering[p] = struct{}{}
}

// waitLingering waits until the processes recorded by addLingering are done,
// their grace over (at most lingerMax); with cut, it cuts their grace first.
func (a *Agent) waitLingering(cut bool) {
	a.lingerMu.Lock()
	ps := make([]*proc, 0, len(a.lingering))
	for p := range a.lingering {
		ps = append(ps, p)
		delete(a.lingering, p)
	}
	a.lingerMu.Unlock()
	for _, p := range ps {
		if cut {
			p.cutGrace()
		}
		<-p.done
	}
}
