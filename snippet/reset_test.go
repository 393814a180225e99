package snippet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
)

// TestReset leaves files (some unreadable), a daemon that left its process
// group and its parent (the sweep of strays is off, as when calls overlap),
// and spares behind; a call with Reset finds an empty directory and none of
// those processes.
func TestReset(t *testing.T) {
	t.Parallel()
	h := startHelper(t, true, 0, helperSparesEnv+"=1", helperKeepStraysEnv+"=1")
	// A directory outside, which a reset that followed symlinks would empty.
	outside := t.TempDir()
	kept := filepath.Join(outside, "kept")
	if err := os.WriteFile(kept, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	mess := fmt.Sprintf(`import os
os.makedirs('locked/deep', exist_ok=True)
open('locked/deep/f', 'w').write('x')
open('top', 'w').write('y')
os.symlink(%q, 'link')
os.chmod('locked/deep', 0)
os.chmod('locked', 0o500)
`, outside) + pyDaemon
	res := call(t, h.socket, request(wire.LanguagePython, mess))
	daemon, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout.Data)))
	if err != nil {
		t.Fatalf("no daemon pid: %s", dump(res))
	}
	call(t, h.socket, request(wire.LanguageShell, "echo warm")) // a shell spare
	if res := call(t, h.socket, request(wire.LanguageShell, "ls -A")); !strings.Contains(string(res.Stdout.Data), "top") {
		t.Fatalf("without Reset the files stay: %s", dump(res))
	}
	if !alive(daemon) {
		t.Fatalf("the daemon %d is not running before the reset", daemon)
	}

	res = call(t, h.socket, request(wire.LanguageShell, "ls -A; echo done", func(r *wire.Request) { r.Reset = true }))
	if string(res.Stdout.Data) != "done\n" || res.ExitCode != 0 {
		t.Fatalf("after Reset the directory is not empty: %s", dump(res))
	}
	waitGone(t, daemon)
	if b, err := os.ReadFile(kept); err != nil || string(b) != "kept" {
		t.Fatalf("the reset followed a symlink: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(h.dir); len(ents) != 0 {
		t.Fatalf("left in %s: %v", h.dir, ents)
	}
	// The agent goes on: Python through a new spare, shell, another reset.
	for _, req := range []*wire.Request{request(wire.LanguagePython, "print('py')"), request(wire.LanguageShell, "echo sh"),
		request(wire.LanguagePython, "print('py')", func(r *wire.Request) { r.Reset = true })} {
		if res := call(t, h.socket, req); res.ExitCode != 0 || len(res.Stdout.Data) == 0 {
			t.Fatalf("after the reset: %s", dump(res))
		}
	}
}

// TestResetWaitsForCalls checks that a reset waits for a running call
// instead of killing it. The agent runs in the test, which sees when the
// reset waits: it holds the calls' lock for writing, and a writer waiting
// makes TryRLock fail. Not parallel: the reset kills every child process of
// the test's, those of the other tests too.
func TestResetWaitsForCalls(t *testing.T) {
	a := testAgent(t)
	a.CleanDirs = []string{a.Dir}
	slow := startRun(a, request(wire.LanguageShell, "touch started; "+untilFile("go")+"echo slow > slow.txt; echo slow"))
	waitFile(t, a, "started")
	reset := startRun(a, request(wire.LanguageShell, "ls -A; echo reset", func(r *wire.Request) { r.Reset = true }))
	waitUntil(t, "the reset to wait for the lock", func() bool {
		if a.calls.TryRLock() {
			a.calls.RUnlock()
			return false
		}
		return true
	})
	release(t, a, "go")
	if s := result(t, slow); string(s.Stdout.Data) != "slow\n" || s.ExitCode != 0 {
		t.Fatalf("the running call was disturbed: %s", dump(s))
	}
	if res := result(t, reset); string(res.Stdout.Data) != "reset\n" {
		t.Fatalf("the reset ran before the running call ended, or did not empty %s: %s", a.Dir, dump(res))
	}
	if _, err := os.Stat(filepath.Join(a.Dir, "slow.txt")); err == nil {
		t.Fatal("slow.txt survived the reset")
	}
}

// TestResetKillsAProcessWithoutItsMainThread: a process whose main thread
// exited shows as a zombie while its other threads run; a reset kills it
// (the sweep of strays is off, as when calls overlap).
func TestResetKillsAProcessWithoutItsMainThread(t *testing.T) {
	t.Parallel()
	h := startHelper(t, true, 0, helperKeepStraysEnv+"=1")
	// The child leaves the snippet's group, starts a thread that writes
	// alive.txt every 50 ms, and ends its main thread; the snippet prints
	// the child's pid once the thread runs.
	code := `import ctypes, os, threading, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    def beat():
        os.write(w, b'x')
        while True:
            with open('alive.txt', 'a') as f:
                f.write('x')
            time.sleep(0.05)
    threading.Thread(target=beat).start()
    ctypes.CDLL(None).syscall(60, 0)  # exit(2) of the main thread only
os.read(r, 1)
print(pid)
`
	res := call(t, h.socket, request(wire.LanguagePython, code))
	pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout.Data)))
	if err != nil {
		t.Fatalf("no pid: %s", dump(res))
	}
	alive := filepath.Join(h.dir, "alive.txt")
	waitUntil(t, "the thread to write", func() bool {
		_, err := os.Stat(alive)
		return err == nil
	})
	waitUntil(t, "the main thread to exit", func() bool {
		state, _ := threadsOf(pid)
		return state == "Z"
	})
	if state, threads := threadsOf(pid); threads < 2 {
		t.Fatalf("process %d: state %s with %d threads, want its thread running", pid, state, threads)
	}
	call(t, h.socket, request(wire.LanguageShell, "true", func(r *wire.Request) { r.Reset = true }))
	waitUntil(t, "the thread to die", func() bool {
		state, threads := threadsOf(pid)
		return state == "" || (state == "Z" || state == "X") && threads < 2
	})
	if _, err := os.Stat(alive); err == nil {
		t.Fatal("a thread of a process whose main thread exited outlived the reset")
	}
}

// threadsOf returns the state of process pid (of its main thread) and its
// number of threads; "" if it is gone.
func threadsOf(pid int) (state string, threads int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // state, ppid, ..., num_threads (18th)
	if len(f) < 18 {
		return "", 0
	}
	threads, _ = strconv.Atoi(f[17])
	return f[0], threads
}

// TestResetLeavesNoFilesLocksOrNames leaves what a later user could find
// without processes of its own: hidden files, a file locked (flock) by a
// daemon that left its group and its parent and holds an abstract Unix
// socket name, a module and a sitecustomize.py planted in site-packages, a
// json.py that would shadow the standard library's, pip's cache (HOME is
// the working directory in a sandbox). After a reset the directory is
// empty, the daemon, its lock and its name are gone, and Python imports as
// new. The sweep of strays is off, so that the reset is what kills the
// daemon.
func TestResetLeavesNoFilesLocksOrNames(t *testing.T) {
	t.Parallel()
	h := startHelper(t, true, 0, helperSparesEnv+"=1", helperKeepStraysEnv+"=1")
	name := fmt.Sprintf("flmbox-reset-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	mess := fmt.Sprintf(`import fcntl, os, socket, time
for d in ['site-packages/planted', '.cache/pip/http', '.hidden-dir']:
    os.makedirs(d)
open('site-packages/planted/__init__.py', 'w').write('X = 1\n')
open('site-packages/sitecustomize.py', 'w').write('import os\nos.environ["PLANTED"] = "1"\n')
open('json.py', 'w').write('PLANTED = 1\n')
open('.cache/pip/http/entry', 'w').write('cached')
open('.hidden', 'w').write('x')
os.mkfifo('.fifo')
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        f = open('.locked', 'w')
        fcntl.flock(f, fcntl.LOCK_EX)
        s = socket.socket(socket.AF_UNIX)
        s.bind(b'\0' + %q.encode())
        os.write(w, b'%%d' %% os.getpid())
        time.sleep(1000)
    os._exit(0)
print(os.read(r, 32).decode())
`, name)
	res := call(t, h.socket, request(wire.LanguagePython, mess))
	daemon, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout.Data)))
	if err != nil {
		t.Fatalf("no daemon pid: %s", dump(res))
	}
	if !alive(daemon) {
		t.Fatalf("the daemon %d is not running before the reset", daemon)
	}
	check := fmt.Sprintf(`import os, socket, sys
print(sorted(os.listdir('.')))
s = socket.socket(socket.AF_UNIX)
try:
    s.bind(b'\0' + %q.encode())
    print('name free')
except OSError:
    print('name taken')
import json
print('json from', 'here' if hasattr(json, 'PLANTED') else 'the standard library')
try:
    import planted
    print('planted imports')
except ImportError:
    print('no planted')
print('sitecustomize ran' if 'PLANTED' in os.environ else 'no sitecustomize')
`, name)
	pythonPath := func(r *wire.Request) { r.Env = []string{"PYTHONPATH=" + filepath.Join(h.dir, "site-packages")} }
	res = call(t, h.socket, request(wire.LanguagePython, check, pythonPath))
	before := "name taken\njson from here\nplanted imports\nno sitecustomize\n" // sitecustomize never runs from PYTHONPATH
	if out := string(res.Stdout.Data); !strings.HasSuffix(out, before) || !strings.Contains(out, "'.locked'") {
		t.Fatalf("without Reset:\n%s\nwant stdout ending %q", dump(res), before)
	}
	res = call(t, h.socket, request(wire.LanguagePython, check, pythonPath, func(r *wire.Request) { r.Reset = true }))
	want := "[]\nname free\njson from the standard library\nno planted\nno sitecustomize\n"
	if string(res.Stdout.Data) != want || res.ExitCode != 0 {
		t.Fatalf("after the reset:\n%s\nwant stdout %q", dump(res), want)
	}
	waitGone(t, daemon)
}

// TestStrandedSockets checks what a reset counts as a socket that no
// process holds: every socket that /proc/net lists but that is not a
// descriptor of the agent's.
func TestStrandedSockets(t *testing.T) {
	t.Parallel()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	var ours []uint64
	for _, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		ours = append(ours, st.Ino)
	}
	const ghost = 4000000001 // no socket of this process's
	netDir := t.TempDir()
	files := map[string]string{
		"unix": "Num       RefCount Protocol Flags    Type St Inode Path\n" +
			fmt.Sprintf("0000000000000000: 00000001 00000000 00000000 0001 03 %d\n", ours[0]) +
			fmt.Sprintf("0000000000000000: 00000001 00000000 00000000 0001 03 %d\n", ours[1]) +
			fmt.Sprintf("0000000000000000: 00000001 00000000 00010000 0001 01 %d @flmbox-cycle\n", ghost) +
			fmt.Sprintf("0000000000000000: 00000001 00000000 00000000 0001 03 %d\n", ghost+1),
		"tcp": "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
			fmt.Sprintf("  41: 0100007F:AFC9 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 %d 1 0000000000000000 0 0 0 0 -1\n", ghost+2),
		"udp": "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n",
		// tcp6 and udp6 are missing, as they may be.
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(netDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := strandedSockets(netDir, "/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"tcp port 45001", "unix @flmbox-cycle", fmt.Sprintf("unix socket %d", ghost+1)}
	if !slices.Equal(got, want) {
		t.Errorf("stranded sockets = %q, want %q", got, want)
	}
	if err := checkStrandedSockets(netDir, "/proc/self/fd"); err == nil || !strings.Contains(err.Error(), "3 sockets are held by no process") {
		t.Errorf("checkStrandedSockets: %v", err)
	}
	// Only the process's own sockets: nothing is stranded.
	os.Remove(filepath.Join(netDir, "tcp"))
	clean := strings.Join(strings.SplitAfter(files["unix"], "\n")[:3], "")
	if err := os.WriteFile(filepath.Join(netDir, "unix"), []byte(clean), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkStrandedSockets(netDir, "/proc/self/fd"); err != nil {
		t.Errorf("checkStrandedSockets with the process's own sockets: %v", err)
	}
}

// TestResetKeepsAPython3Spare: a reset leaves a python3 that the agent
// started as the Python spare: one it starts as it begins the first time
// (the spare was the zygote's), then the reserve that the agent keeps
// beside the zygote's spares once a reset has run. The zygote and its spare
// are gone, and the call after the reset runs in that python3. Not
// parallel: the agent runs in the test, and its resets kill every child
// process of the test's.
func TestResetKeepsAPython3Spare(t *testing.T) {
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: true}
	a.CleanDirs = []string{a.Dir}
	socket := serve(t, a)
	where := "import os; print(os.getpid(), os.getppid())"
	ran := func(req *wire.Request) (pid, ppid int) {
		t.Helper()
		res := call(t, socket, req)
		f := strings.Fields(string(res.Stdout.Data))
		if res.ExitCode != 0 || len(f) != 2 {
			t.Fatalf("call: %s", dump(res))
		}
		pid, _ = strconv.Atoi(f[0])
		ppid, _ = strconv.Atoi(f[1])
		return pid, ppid
	}
	reset := func(r *wire.Request) { r.Reset = true }
	for range 2 {
		ran(request(wire.LanguagePython, where))
		waitSpare(t, a, wire.LanguagePython)
	}
	for i := range 2 {
		z := a.zygote(false)
		if z == nil {
			t.Fatalf("round %d: no zygote", i)
		}
		a.mu.Lock()
		reserve := a.reserve
		a.mu.Unlock()
		if (reserve != nil) != (i > 0) {
			t.Fatalf("round %d: reserve %v", i, reserve)
		}
		pid, ppid := ran(request(wire.LanguagePython, where, reset))
		if ppid != os.Getpid() {
			t.Errorf("round %d: the call after the reset ran in a child of %d, not of the agent", i, ppid)
		}
		if reserve != nil && pid != reserve.pid {
			t.Errorf("round %d: the call after the reset ran in %d, not in the reserve %d", i, pid, reserve.pid)
		}
		waitGone(t, z.process.Pid)
		// The next spare is the zygote's again, and the reserve is kept.
		waitUntil(t, "the reserve", func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.reserve != nil
		})
		if _, ppid := ran(request(wire.LanguagePython, where)); ppid == os.Getpid() {
			t.Errorf("round %d: a call after the reset's ran in a python3 of the agent's, not the zygote's", i)
		}
		waitSpare(t, a, wire.LanguagePython)
	}
}

// TestStaleHandOutsAreRefused: once a reset made another hand-out current,
// a request of the hand-out before (a holder's stale handle) runs nothing,
// resets nothing, copies nothing; the current one and requests of no
// hand-out (by name) run.
func TestStaleHandOutsAreRefused(t *testing.T) {
	t.Parallel()
	h := startHelper(t, true, 0)
	as := func(handOut string, f ...func(*wire.Request)) func(*wire.Request) {
		return func(r *wire.Request) {
			r.HandOut = handOut
			for _, g := range f {
				g(r)
			}
		}
	}
	if res := call(t, h.socket, request(wire.LanguageShell, "echo a > mine", as("first"))); res.ExitCode != 0 || res.Stale {
		t.Fatalf("before any hand-out, a request of one runs: %s", dump(res))
	}
	res := call(t, h.socket, request(wire.LanguageShell, "ls", func(r *wire.Request) { r.Reset, r.NewHandOut = true, "second" }))
	if res.ExitCode != 0 || len(res.Stdout.Data) != 0 {
		t.Fatalf("the reset to hand-out second: %s", dump(res))
	}
	call(t, h.socket, request(wire.LanguageShell, "echo b > theirs", as("second")))
	for _, req := range []*wire.Request{
		request(wire.LanguageShell, "cat theirs", as("first")),
		request(wire.LanguageShell, "cat theirs", as("first", func(r *wire.Request) { r.Reset = true })),
	} {
		if res := call(t, h.socket, req); !res.Stale || res.ExitCode != -1 || len(res.Stdout.Data) != 0 {
			t.Fatalf("a stale request (reset %v): %s", req.Reset, dump(res))
		}
	}
	for _, handOut := range []string{"second", ""} {
		if res := call(t, h.socket, request(wire.LanguageShell, "cat theirs", as(handOut))); res.Stale || string(res.Stdout.Data) != "b\n" {
			t.Fatalf("a request of hand-out %q: %s", handOut, dump(res))
		}
	}
	a := testAgent(t)
	second := "second"
	a.handOut.Store(&second)
	if res := a.copy(context.Background(), &wire.Copy{Op: wire.CopyOut, Path: a.dir, HandOut: "first"}, nil, nil); !res.Stale {
		t.Fatalf("a stale copy: %s", dump(res))
	}
}
