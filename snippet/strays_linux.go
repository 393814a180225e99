package snippet

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Strays.
//
// When a snippet ends, the rest of its process group is killed (after a
// grace, see proc.linger), so that a `sleep 1000 &` does not outlive its
// call. A process that left the group
// (setsid, a daemon's double fork) is out of reach of that; it would run on
// between calls, unwatched (the memory watch follows process groups, and
// only while calls run), taking CPU and memory from the calls after it. So
// once a call that ran code has ended and no call is running, the agent
// kills every such stray: every process of the sandbox but the agent, its
// spares and its zygote, which are then all that may run (Agent.KillStrays).
// Nothing that a call starts outlives it for longer than the calls running
// beside it.
//
// This happens only where orphans come back to the agent, as PID 1 of its
// sandbox or a child subreaper (one agent per process then): elsewhere the
// agent cannot tell its processes from others'. It takes a short pass over
// /proc after the call's answer is sent, or, if the next call comes first,
// before that one runs: calls made one after the other never meet the strays
// of the ones before.

// strayDeadline bounds a sweep: strays that keep coming (a daemon that
// forks as fast as it is killed) are left to the next one.
const strayDeadline = time.Second

// sweepStrays kills the strays if a call that ran code ended since the last
// sweep and no call is running now; when one is, the sweep is left to the
// end of the last one. It first waits for the graces of the calls' process
// groups to end (Agent.waitLingering), a second at most. It returns once the strays are gone, reaped too when
// the agent is their parent (it reaps the orphans, as PID 1): a zombie
// still counts in its user's RLIMIT_NPROC, and a call that follows must be
// able to start as many processes as the limit says.
func (a *Agent) sweepStrays() {
	if !a.sweeps || !a.leftovers.Load() {
		return
	}
	if !a.calls.TryLock() {
		return // a call runs (its end sweeps), or a reset kills everything
	}
	defer a.calls.Unlock()
	// What the calls left in their groups first has its grace.
	a.waitLingering(false)
	a.leftovers.Store(false)
	// The zygote's children are its spares only if it said so: a snippet
	// can make a process of its own a child of the zygote (clone with
	// CLONE_PARENT). While the zygote's lock is held, it gets no new request.
	a.mu.Lock()
	z := a.zyg
	a.mu.Unlock()
	zpid, forking := 0, false
	if z != nil {
		z.mu.Lock()
		defer z.mu.Unlock()
		zpid, forking = z.process.Pid, len(z.forks) > 0
	}
	if forking {
		a.leftovers.Store(true) // its child is not known yet: look again later
	}
	// Spares being started are registered before they can be seen.
	children.start.Lock()
	defer children.start.Unlock()
	self := os.Getpid()
	keep := func(pid, ppid int) bool {
		switch {
		case ppid == self:
			return isChild(pid) // spares, the zygote
		case z != nil && ppid == zpid:
			// (Without a zygote zpid is 0, the parent gVisor gives the
			// processes of runsc exec.)
			_, spare := z.procs[pid]
			return forking || spare
		}
		return false
	}
	unkillable := map[int]bool{}
	for deadline := time.Now().Add(strayDeadline); ; time.Sleep(time.Millisecond) {
		procs, err := readProcs()
		if err != nil {
			a.leftovers.Store(true) // try again at the next call
			return
		}
		// The reaper waits for the start lock, held here: reap the
		// strays' zombies here, and look again.
		dead := deadStrays(procs, self, keep)
		for _, pid := range dead {
			reap(pid)
		}
		left := len(dead)
		for _, pid := range strays(procs, self, keep) {
			if unkillable[pid] {
				continue
			}
			// A process of another user (root, from runsc exec --user 0)
			// cannot be killed: leave it.
			if err := unix.Kill(pid, unix.SIGKILL); err == unix.EPERM {
				unkillable[pid] = true
				continue
			}
			left++
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			a.leftovers.Store(true)
			return
		}
	}
}

// deadStrays returns the zombies of procs that the agent (self) is to reap
// and keep does not keep: strays that died and still count.
func deadStrays(procs map[int]procEntry, self int, keep func(pid, ppid int) bool) []int {
	var out []int
	for pid, p := range procs {
		if !p.alive && p.ppid == self && !keep(pid, p.ppid) {
			out = append(out, pid)
		}
	}
	return out
}

// strays returns the live processes of procs (those of self, see ours) that
// keep does not keep; keep is given a process and its parent.
func strays(procs map[int]procEntry, self int, keep func(pid, ppid int) bool) []int {
	var out []int
	for _, pid := range ours(procs, self) {
		if p := procs[pid]; p.alive && !keep(pid, p.ppid) {
			out = append(out, pid)
		}
	}
	return out
}
