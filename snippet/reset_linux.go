package snippet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
)

// resetTimeout bounds how long Reset waits for killed processes to go.
const resetTimeout = 5 * time.Second

// Reset returns the sandbox to a clean state, as if it were new, so that a
// running sandbox can serve an unrelated snippet (Request.Reset): it waits
// for the calls running to end, then kills the spares, the zygote and every
// other process descended from the agent (every process of the sandbox when
// the agent is its PID 1: processes that left their group or their parent
// too), and empties CleanDirs. As PID 1 it then clears what the sandbox's
// kernel keeps with no process behind it (leftovers_linux.go): it removes
// the System V IPC objects (shared memory, semaphores, message queues) of
// the snippets' user and every POSIX message queue, and fails if a snippet
// made a keyring or left a socket that no process holds (a cycle of
// descriptors in flight), neither of which anything can remove: such a
// sandbox must be replaced. To list the message queues, the first reset as
// PID 1 starts the agent's own program (os.Executable) with HelperArg: that
// program must call RunHelper then.
//
// The reset leaves the Python spare that a new agent starts (none with
// LazySpares): a python3 that the agent started and that waits for its code,
// which the reset spares, so that the next call need not wait for one to
// start. That is the Python spare if it is one (not a fork of the zygote),
// else the reserve, which the agent keeps beside the zygote's spares once a
// reset has run (see refillReserveLocked), else one the reset starts as it
// begins, so that its start overlaps the reset instead of following it. Such
// a python3 is as a new one: it runs as the agent's user, which no snippet
// can signal, trace or read, and reads nothing that snippets can write
// before its gate (see pythonSiteDef and pythonBootstrapDef), so no snippet,
// before the reset or after, can reach it or leave anything in it. No spare
// starts for the calls before the reset while it waits.
//
// What Reset does not undo is documented with Agent.CleanDirs, and in
// docs/ARCHITECTURE.md ("What a sandbox can hold, and how a reset clears
// it").
func (a *Agent) Reset(ctx context.Context) error {
	_, err := a.resetAs(ctx, "", "")
	return err
}

// resetAs is Reset for a request of hand-out handOut (wire.Request.HandOut:
// refused, stale, if it is not the current one once the reset holds the
// calls' lock), which makes newHandOut the current one, if set, at that
// moment.
func (a *Agent) resetAs(ctx context.Context, handOut, newHandOut string) (stale *wire.Result, err error) {
	a.init()
	a.resets.Add(1) // no refill starts from here on: its spare would be dropped
	defer a.resets.Add(-1)
	spare := a.takePristine()
	var fresh chan *proc
	if spare == nil && a.Spares && !a.LazySpares {
		fresh = make(chan *proc, 1)
		go func() { fresh <- a.python3Spare() }()
	}
	a.calls.Lock()
	defer a.calls.Unlock()
	if stale := a.staleResult(handOut); stale != nil {
		if fresh != nil {
			if p := <-fresh; p != nil {
				p.discard()
			}
		}
		if spare != nil {
			a.keepSpare(spare)
		}
		return stale, nil
	}
	if newHandOut != "" {
		a.handOut.Store(&newHandOut)
	}
	// Spares being started (by the last call) may have started with the
	// old /tmp: the zygote goes first, so that a fork it was asked for fails
	// at once, then the others are waited for and dropped.
	a.dropSpares()
	if fresh != nil {
		spare = <-fresh
	}
	if err := a.reset(ctx, spare); err != nil {
		if spare != nil {
			spare.discard()
		}
		return nil, err
	}
	a.mu.Lock()
	a.resetDone = true
	a.mu.Unlock()
	if spare != nil {
		a.keepSpare(spare)
	}
	return nil, nil
}

// takePristine takes, for after a reset, the reserve or the Python spare if
// either is a python3 that the agent started and that waits for its code
// (see Reset), or returns nil.
func (a *Agent) takePristine() *proc {
	if !a.Spares || a.LazySpares {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.reserve; p != nil {
		a.reserve = nil
		if p.running() && p.limits == a.SpareLimits {
			return p
		}
		p.discard()
	}
	if p := a.pristineSpareLocked(); p != nil {
		delete(a.spares, p.lang)
		return p
	}
	return nil
}

// reset is Reset's work once the calls have ended and the zygote is gone;
// it kills every process but the agent and spare, the Python spare started
// for after the reset (nil: none).
func (a *Agent) reset(ctx context.Context, spare *proc) error {
	if err := a.waitRefills(); err != nil {
		return err
	}
	a.dropSpares()
	a.waitLingering(true) // what the reset kills needs no grace
	keep := 0
	if spare != nil {
		keep = spare.pid
	}
	if err := killOthers(ctx, keep); err != nil {
		return err
	}
	for _, d := range a.CleanDirs {
		if err := emptyDir(d); err != nil {
			return err
		}
	}
	if os.Getpid() != 1 {
		// Only PID 1's namespaces are the sandbox's own: elsewhere what
		// follows is the host's.
		return nil
	}
	// As the snippets' user: only an object's owner (or CAP_SYS_ADMIN,
	// which the agent lacks) may remove it.
	if err := asUser(a.User, func() error { return removeSysvIPC(&a.sysv) }); err != nil {
		return err
	}
	if err := a.removePosixMQueues(); err != nil {
		return err
	}
	if err := a.checkKeyrings(ctx); err != nil {
		return err
	}
	return checkStrandedSockets("/proc/net", "/proc/self/fd")
}

// python3Spare starts a Python spare that is a new python3 (not a fork of
// the zygote) with the limits of Serve's first one, for a reset; nil when
// the agent starts none.
func (a *Agent) python3Spare() *proc {
	if !a.Spares || a.LazySpares || a.pythonErr != nil || a.memoryShort() {
		return nil
	}
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil
	}
	runs, idle := a.spareMark()
	c := pythonCommand(a.User, true)
	c.args[0] = a.python
	p, err := a.startExec(a.python, c, a.pyEnv, nil, a.SpareLimits, false)
	if err != nil {
		return nil // the first Python call starts its own
	}
	p.lang, p.runs, p.idleStart, p.pristine = wire.LanguagePython, runs, idle, true
	return p
}

// keepSpare makes p the spare of its language, unless the agent has one
// or is closed.
func (a *Agent) keepSpare(p *proc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.spares == nil {
		a.refilling, a.spares = map[string]*refilling{}, map[string]*proc{}
	}
	if a.closed || a.spares[p.lang] != nil {
		p.discard()
		return
	}
	a.spares[p.lang] = p
}

// waitRefills waits for the spares being started; starting one is bounded
// by zygoteDeadline, and no new one starts while the calls are locked.
func (a *Agent) waitRefills() error {
	a.mu.Lock()
	var pending []chan struct{}
	for _, r := range a.refilling {
		pending = append(pending, r.done)
	}
	a.mu.Unlock()
	for _, done := range pending {
		select {
		case <-done:
		case <-time.After(resetTimeout + zygoteDeadline):
			return fmt.Errorf("reset: a spare process is still starting after %s", resetTimeout+zygoteDeadline)
		}
	}
	return nil
}

// dropSpares kills the spares and the zygote; the next calls start new ones.
func (a *Agent) dropSpares() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropSparesLocked()
	a.pythonUsed, a.zygoteFailures = false, 0
}

// killOthers kills, with SIGKILL, every process descended from this one (or
// every other process, for PID 1) but keep (0: none) until none is left but
// zombies, which the reaper and Run reap.
func killOthers(ctx context.Context, keep int) error {
	deadline := time.Now().Add(resetTimeout)
	for {
		pids, err := others(keep)
		if err != nil {
			return fmt.Errorf("reset: list processes: %w", err)
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reset: %d processes are still alive %s after SIGKILL: %v", len(pids), resetTimeout, pids)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("reset: %w", context.Cause(ctx))
		case <-time.After(time.Millisecond):
		}
	}
}

// others returns the live (not zombie) processes descended from this one
// but keep; for PID 1, all other processes but keep.
func others(keep int) ([]int, error) {
	procs, err := readProcs()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, pid := range ours(procs, os.Getpid()) {
		if procs[pid].alive && pid != keep {
			out = append(out, pid)
		}
	}
	return out, nil
}

// procEntry is a process as /proc shows it.
type procEntry struct {
	ppid  int
	alive bool // not a zombie, or a zombie whose other threads run on
}

// readProcs reads every process but this one from /proc.
func readProcs() (map[int]procEntry, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	procs := map[int]procEntry{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if i < 0 || len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		// A process whose main thread exited shows as a zombie while its
		// other threads run on: count the threads (field 20).
		threads := 0
		if len(f) > 17 {
			threads, _ = strconv.Atoi(f[17])
		}
		procs[pid] = procEntry{ppid: ppid, alive: f[0] != "Z" && f[0] != "X" || threads > 1}
	}
	return procs, nil
}

// ours returns the processes of procs descended from self, in no particular
// order; for PID 1, all of them.
func ours(procs map[int]procEntry, self int) []int {
	var out []int
	if self == 1 {
		for pid := range procs {
			out = append(out, pid)
		}
		return out
	}
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	queue := []int{self}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		out = append(out, children[pid]...)
		queue = append(queue, children[pid]...)
	}
	return out
}

// emptyDir removes everything in dir, including directories that a snippet
// made unreadable or unwritable (their owner may change their mode).
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reset: empty %s: %w", dir, err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if os.RemoveAll(p) == nil {
			continue
		}
		makeWritable(p)
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("reset: empty %s: %w", dir, err)
		}
	}
	return nil
}

// makeWritable gives the owner full access to p and to every directory
// below it; it does not follow symlinks.
func makeWritable(p string) {
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return
	}
	unix.Chmod(p, 0o700)
	ents, _ := os.ReadDir(p)
	for _, e := range ents {
		makeWritable(filepath.Join(p, e.Name()))
	}
}
