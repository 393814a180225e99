package snippet

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

func TestStrays(t *testing.T) {
	t.Parallel()
	// 10 is the agent: 11 its zygote and 12 its shell spare; 13 the zygote's
	// spare; 14 was reparented to it (setsid and double fork), 15 is 14's
	// child, 16 a child of a spare, 19 a child that a snippet gave the
	// zygote (clone with CLONE_PARENT), 17 a zombie, 18 a process without
	// its main thread; 2 and 20 are not the agent's descendants.
	procs := map[int]procEntry{
		2:  {ppid: 0, alive: true},
		11: {ppid: 10, alive: true},
		12: {ppid: 10, alive: true},
		13: {ppid: 11, alive: true},
		14: {ppid: 10, alive: true},
		15: {ppid: 14, alive: true},
		16: {ppid: 12, alive: true},
		17: {ppid: 10, alive: false},
		18: {ppid: 10, alive: true},
		19: {ppid: 11, alive: true},
		20: {ppid: 2, alive: true},
	}
	keep := func(agent int) func(pid, ppid int) bool {
		return func(pid, ppid int) bool {
			return ppid == agent && (pid == 11 || pid == 12) || ppid == 11 && pid == 13
		}
	}
	got := strays(procs, 10, keep(10))
	slices.Sort(got)
	if want := []int{14, 15, 16, 18, 19}; !slices.Equal(got, want) {
		t.Errorf("strays of 10 = %v, want %v", got, want)
	}
	// As PID 1, every process is the agent's: 2 and 20 are strays too.
	for _, pid := range []int{11, 12, 14, 17, 18} {
		p := procs[pid]
		p.ppid = 1
		procs[pid] = p
	}
	got = strays(procs, 1, keep(1))
	slices.Sort(got)
	if want := []int{2, 14, 15, 16, 18, 19, 20}; !slices.Equal(got, want) {
		t.Errorf("strays of PID 1 = %v, want %v", got, want)
	}
}

// TestStraysAreKilledAfterTheCall runs an agent that is a child subreaper,
// with spares, as in a sandbox: processes that left their call's process
// group (setsid, a daemon) are gone soon after the call, while the zygote
// and the spares of both languages, started before, live on and run the
// next calls.
func TestStraysAreKilledAfterTheCall(t *testing.T) {
	t.Parallel()
	h := startHelper(t, true, 0, helperSparesEnv+"=1")
	agent := h.cmd.Process.Pid
	daemon := pyDaemon + "print(os.getpid(), os.getppid())\n"
	// The calls wait until their daemons have left the group: those that
	// have not yet are killed with it.
	const shellStray = "setsid sh -c 'echo $$ > stray.pid; exec sleep 1000' &\n" +
		"until [ -s stray.pid ]; do sleep 0.01; done\ncat stray.pid; rm stray.pid"
	// Each call first checks that the stray of the call before it is gone,
	// reaped too: a zombie still counts in its user's RLIMIT_NPROC. (One
	// that the zygote adopted is the zygote's to reap: not running is
	// enough there.)
	pyReaped := func(pid int) string {
		return fmt.Sprintf("import os\nassert not os.path.exists('/proc/%d'), 'the stray of the last call is there'\n", pid)
	}
	shGone := func(pid int) string {
		return fmt.Sprintf("if [ -e /proc/%d ]; then echo the stray of the last call is there >&2; exit 1; fi\n", pid)
	}
	pyGone := func(pid int) string {
		return fmt.Sprintf(`def running(pid):
    try:
        s = open('/proc/%%d/stat' %% pid).read()
    except OSError:
        return False
    return s[s.rindex(')') + 2] != 'Z'
assert not running(%d), 'the stray of the last call runs'
`, pid)
	}
	// The first Python call runs in a python3 of its own; the zygote starts
	// after it and forks the next spare.
	res := call(t, h.socket, request(wire.LanguagePython, daemon))
	stray := pids(t, res)[0]
	zygote := waitChild(t, agent, "_flmbox_zygote")
	spare := waitChild(t, zygote, "")
	for round := 0; round < 3; round++ {
		res := call(t, h.socket, request(wire.LanguageShell, shGone(stray)+shellStray))
		got := pids(t, res)
		if len(got) != 1 {
			t.Fatalf("round %d: want the stray's pid: %s", round, dump(res))
		}
		stray = got[0]
		// The Python spare forked before the shell call ran runs this one.
		res = call(t, h.socket, request(wire.LanguagePython, pyReaped(stray)+daemon))
		got = pids(t, res)
		if len(got) != 3 || got[1] != spare || got[2] != zygote {
			t.Fatalf("round %d: want the daemon's pid, then the spare %d of zygote %d; got %v (%s)", round, spare, zygote, got, dump(res))
		}
		stray = got[0]
		spare = waitChild(t, zygote, "")
		if !isDash("/bin/sh") {
			continue // no shell spares
		}
		shSpare := waitChild(t, agent, "sh\x00-s\x00")
		res = call(t, h.socket, request(wire.LanguageShell, "echo $$\n"+shGone(stray)+shellStray))
		got = pids(t, res)
		if len(got) != 2 || got[0] != shSpare {
			t.Fatalf("round %d: want the shell spare %d, then the stray; got %v (%s)", round, shSpare, got, dump(res))
		}
		stray = got[1]
	}
	// A snippet can make its child a child of the zygote (clone with
	// CLONE_PARENT), where the zygote's spares are: it is a stray all the same.
	res = call(t, h.socket, request(wire.LanguagePython, pyReaped(stray)+cloneParentDaemon))
	got := pids(t, res)
	if len(got) != 2 || got[1] != zygote {
		t.Fatalf("want the daemon's pid and its parent, the zygote %d; got %v (%s)", zygote, got, dump(res))
	}
	stray = got[0]
	res = call(t, h.socket, request(wire.LanguagePython, pyGone(stray)+"print(1)"))
	if res.ExitCode != 0 {
		t.Fatalf("the daemon that the zygote adopted outlived its call: %s", dump(res))
	}
	waitGone(t, stray)
}

// pyDaemon starts a daemon that leaves its process group and its parent
// (setsid and a double fork), and prints its pid, without a newline, once it
// has.
const pyDaemon = `import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, b'%d' % os.getpid())
        time.sleep(1000)
    os._exit(0)
print(os.read(r, 32).decode(), end=' ')
`

// cloneParentDaemon starts a daemon as a sibling of the snippet's process
// (clone(2) with CLONE_PARENT, a child of the zygote in a zygote's child),
// and prints its pid and parent once it has left the snippet's group.
const cloneParentDaemon = `import ctypes, os, time
r, w = os.pipe()
pid = ctypes.CDLL(None, use_errno=True).syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT|SIGCHLD)
if pid == 0:
    os.setsid()
    os.write(w, b'%d %d\n' % (os.getpid(), os.getppid()))
    time.sleep(1000)
    os._exit(0)
print(os.read(r, 64).decode().strip())
`

// waitChild waits until process parent has a live child whose command line
// contains cmd, and returns it.
func waitChild(t *testing.T, parent int, cmd string) int {
	t.Helper()
	for deadline := time.Now().Add(guard); ; time.Sleep(10 * time.Millisecond) {
		for pid, state := range childrenOf(t, parent) {
			line, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			if state != "Z" && bytes.Contains(line, []byte(cmd)) {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d has no child running %q", parent, cmd)
		}
	}
}
