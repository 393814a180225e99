package snippet

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/snippet/wire"
)

// TestReset leaves files (some unreadable), a daemon that left its process
// group and its parent (the sweep of strays is off, as when calls overlap),
// and spares behind; a call with Reset finds an empty directory and none of
// those processes.
func TestReset(t *testing.T) {
	t.Setenv(helperSparesEnv, "1")
	t.Setenv(helperKeepStraysEnv, "1")
	h := startHelper(t, true, 0)
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
// instead of killing it. The agent runs in the test (its reset kills the
// test's other child processes: there are none), which sees when the reset
// waits: it holds the calls' lock for writing, and a writer waiting makes
// TryRLock fail.
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
	t.Setenv(helperKeepStraysEnv, "1")
	h := startHelper(t, true, 0)
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
