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
)

// resetTimeout bounds how long Reset waits for killed processes to go.
const resetTimeout = 5 * time.Second

// Reset returns the sandbox to a clean state, as if it were new, so that a
// running sandbox can serve an unrelated snippet (Request.Reset): it waits
// for the calls running to end, then kills the spares, the zygote and every
// other process descended from the agent (every process of the sandbox when
// the agent is its PID 1: processes that left their group or their parent
// too), empties CleanDirs, and, as PID 1, removes the System V IPC objects
// (shared memory, semaphores, message queues) of the snippets' user.
//
// What Reset does not undo is documented with Agent.CleanDirs.
func (a *Agent) Reset(ctx context.Context) error {
	a.init()
	a.calls.Lock()
	defer a.calls.Unlock()
	// Spares being started (by the last call) may have started with the
	// old /tmp: let them finish, then drop them with the others.
	if err := a.waitRefills(); err != nil {
		return err
	}
	a.dropSpares()
	if err := killOthers(ctx); err != nil {
		return err
	}
	for _, d := range a.CleanDirs {
		if err := emptyDir(d); err != nil {
			return err
		}
	}
	if os.Getpid() == 1 {
		// Only then is the IPC namespace the sandbox's own: elsewhere
		// these objects are the host's.
		// As the snippets' user: only an object's owner (or CAP_SYS_ADMIN,
		// which the agent lacks) may remove it.
		return asUser(a.User, removeSysvIPC)
	}
	return nil
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
// every other process, for PID 1) until none is left but zombies, which the
// reaper and Run reap.
func killOthers(ctx context.Context) error {
	deadline := time.Now().Add(resetTimeout)
	for {
		pids, err := others()
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

// others returns the live (not zombie) processes descended from this one;
// for PID 1, all other processes.
func others() ([]int, error) {
	procs, err := readProcs()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, pid := range ours(procs, os.Getpid()) {
		if procs[pid].alive {
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

// maxIPCScan bounds the identifiers removeSysvIPC goes through: a sandbox
// whose snippets used more is not reset (and gets replaced).
const maxIPCScan = 1 << 16

// removeSysvIPC removes every System V shared memory segment, semaphore set
// and message queue of the sandbox. gVisor gives out identifiers in
// increasing order and does not list them (its SHM_INFO and MSG_INFO do not
// give the highest one), so it makes a new object of each kind, whose
// identifier is the highest, and removes every identifier up to it.
func removeSysvIPC() error {
	const ipcRMID, ipcPrivate = 0, 0
	for _, k := range []struct {
		name string
		get  func() (uintptr, unix.Errno)
		rm   func(id uintptr)
	}{
		{"shared memory segment", func() (uintptr, unix.Errno) {
			r, _, e := unix.Syscall(unix.SYS_SHMGET, ipcPrivate, 4096, 0o600)
			return r, e
		}, func(id uintptr) { unix.Syscall(unix.SYS_SHMCTL, id, ipcRMID, 0) }},
		{"semaphore set", func() (uintptr, unix.Errno) {
			r, _, e := unix.Syscall(unix.SYS_SEMGET, ipcPrivate, 1, 0o600)
			return r, e
		}, func(id uintptr) { unix.Syscall6(unix.SYS_SEMCTL, id, 0, ipcRMID, 0, 0, 0) }},
		{"message queue", func() (uintptr, unix.Errno) {
			r, _, e := unix.Syscall(unix.SYS_MSGGET, ipcPrivate, 0o600, 0)
			return r, e
		}, func(id uintptr) { unix.Syscall(unix.SYS_MSGCTL, id, ipcRMID, 0) }},
	} {
		highest, errno := k.get()
		if errno != 0 {
			return fmt.Errorf("reset: make a System V %s: %w", k.name, errno)
		}
		if highest > maxIPCScan {
			k.rm(highest)
			return fmt.Errorf("reset: System V %s identifiers reach %d: the sandbox used too many to clear", k.name, highest)
		}
		for id := uintptr(0); id <= highest; id++ {
			k.rm(id)
		}
	}
	return nil
}
