package snippet

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The agent runs as PID 1 of its sandbox, so the kernel makes it the parent
// of every orphan: a `sleep 1000 &` whose shell exited is reparented to the
// agent before the agent kills it, and its zombie stays until the agent waits
// for it. Serve reaps those zombies; it must leave alone the children that
// Run started and waits for itself. Every child Run starts is registered in
// children (process-wide, since any Agent in the process may reap), and
// starting a child and registering it happen under children.start's read
// lock, which the reaper takes for writing: a child is never seen by the
// reaper before it is registered.
var children = struct {
	start sync.RWMutex
	mu    sync.Mutex
	pids  map[int]struct{}
	sweep chan struct{} // a Run ended: look for zombies its child hid
}{pids: map[int]struct{}{}, sweep: make(chan struct{}, 1)}

// startChild starts cmd under the start lock and registers its pid.
func startChild(cmd *exec.Cmd) (int, error) {
	children.start.RLock()
	defer children.start.RUnlock()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	children.mu.Lock()
	children.pids[pid] = struct{}{}
	children.mu.Unlock()
	return pid, nil
}

// forgetChild unregisters a child that its Run has reaped.
func forgetChild(pid int) {
	children.mu.Lock()
	delete(children.pids, pid)
	children.mu.Unlock()
	select {
	case children.sweep <- struct{}{}:
	default:
	}
}

func isChild(pid int) bool {
	children.mu.Lock()
	defer children.mu.Unlock()
	_, ok := children.pids[pid]
	return ok
}

// reapsOrphans says whether orphans are reparented to this process.
func reapsOrphans() bool {
	if os.Getpid() == 1 {
		return true
	}
	var subreaper int32
	err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&subreaper)), 0, 0, 0)
	return err == nil && subreaper != 0
}

// reapLoop reaps orphans on every SIGCHLD and after every Run, until ctx is
// done.
func reapLoop(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		reapOrphans()
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-children.sweep:
		}
	}
}

// reapOrphans waits for every exited child that Run does not own. waitid
// with WNOWAIT shows the first exited child without reaping it; when that one
// belongs to a Run, the zombies behind it wait for the sweep its Run triggers
// once it has reaped it.
func reapOrphans() {
	children.start.Lock()
	defer children.start.Unlock()
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		pid := siginfoPID(&info)
		if err != nil || pid <= 0 || isChild(pid) {
			return // no children (ECHILD), none exited, or Run's own
		}
		reap(pid)
	}
}

// reap waits for child pid if it has exited. The caller holds
// children.start and pid is none of Run's.
func reap(pid int) {
	var status unix.WaitStatus
	for {
		if _, err := unix.Wait4(pid, &status, unix.WNOHANG, nil); err != unix.EINTR {
			return
		}
	}
}

// siginfoPID returns si_pid of a SIGCHLD siginfo (x/sys/unix does not
// expose it): it follows si_signo, si_errno and si_code, and the union that
// holds it is pointer-aligned.
func siginfoPID(info *unix.Siginfo) int {
	off := 12
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	b := (*[unsafe.Sizeof(*info)]byte)(unsafe.Pointer(info))
	return int(int32(binary.NativeEndian.Uint32(b[off : off+4])))
}

// siginfoStatus returns the wait status of a child's SIGCHLD siginfo, as
// wait4 would give it: si_status follows si_pid and si_uid.
func siginfoStatus(info *unix.Siginfo) unix.WaitStatus {
	off := 12
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	b := (*[unsafe.Sizeof(*info)]byte)(unsafe.Pointer(info))
	status := int32(binary.NativeEndian.Uint32(b[off+8 : off+12]))
	switch info.Code {
	case cldExited:
		return unix.WaitStatus((status & 0xff) << 8)
	case cldDumped:
		return unix.WaitStatus(status&0x7f | 0x80)
	default: // CLD_KILLED
		return unix.WaitStatus(status & 0x7f)
	}
}

// si_code of SIGCHLD (x/sys/unix does not define them).
const (
	cldExited = 1
	cldDumped = 3
)
