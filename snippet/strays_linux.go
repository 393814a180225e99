package snippet

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Strays.
//
// When a snippet ends, the rest of its process group is killed, so that a
// `sleep 1000 &` does not outlive its call. A process that left the group
// (setsid, a daemon's double fork) is out of reach of that; it would run on
// between calls, unwatched (the memory watch follows process groups, and
// only while calls run), taking CPU and memory from the calls after it. So
// once a call that ran code has ended and no call is running, the agent
// kills every such stray: every process of the sandbox but the agent, its
// spares and its zygote, which are then all that may run. Nothing that a
// call starts outlives it for longer than the calls running beside it.
//
// This happens only where orphans come back to the agent, as PID 1 of its
// sandbox or a child subreaper (one agent per process then): elsewhere the
// agent cannot tell its processes from others'. It takes a pass over /proc
// (under a millisecond in gVisor) after the call's answer is sent, or, if
// the next call comes first, before that one runs: calls made one after the
// other never meet the strays of the ones before.

// sweepStrays kills the strays if a call that ran code ended since the last
// sweep and no call is running now; when one is, the sweep is left to the
// end of the last one. It returns once the strays are gone (zombies at
// most, which the reaper reaps), so that a call that follows finds none.
func (a *Agent) sweepStrays() {
	if !a.sweeps || !a.leftovers.Load() {
		return
	}
	if !a.calls.TryLock() {
		return // a call runs (its end sweeps), or a reset kills everything
	}
	defer a.calls.Unlock()
	a.leftovers.Store(false)
	// Spares being started are registered before they can be seen.
	children.start.Lock()
	defer children.start.Unlock()
	deadline := time.Now().Add(resetTimeout)
	for {
		procs, err := readProcs()
		if err != nil {
			a.leftovers.Store(true) // try again at the next call
			return
		}
		pids := strays(procs, os.Getpid(), isChild)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			a.leftovers.Store(true)
			return
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// strays returns the live processes of procs (those of self, see ours) that
// may not run while no call does: all but the registered children of self
// (child says which), spares or the zygote, and their own children, the
// zygote's spares. A spare runs no code of its own before its call, and
// every process that a call started and that has not been reaped was
// reparented to self (PID 1) and is not registered.
func strays(procs map[int]procEntry, self int, child func(pid int) bool) []int {
	spare := func(pid int) bool {
		p, ok := procs[pid]
		return ok && p.ppid == self && child(pid)
	}
	var out []int
	for _, pid := range ours(procs, self) {
		if p := procs[pid]; p.alive && !spare(pid) && !spare(p.ppid) {
			out = append(out, pid)
		}
	}
	return out
}
