package snippet

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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
	mess := `import os
os.makedirs('locked/deep', exist_ok=True)
open('locked/deep/f', 'w').write('x')
open('top', 'w').write('y')
os.symlink('/etc/passwd', 'link')
os.chmod('locked/deep', 0)
os.chmod('locked', 0o500)
` + pyDaemon
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
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatalf("the reset followed a symlink: %v", err)
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
// instead of killing it.
func TestResetWaitsForCalls(t *testing.T) {
	h := startHelper(t, true, 0)
	slow := make(chan *wire.Result, 1)
	go func() {
		slow <- call(t, h.socket, request(wire.LanguageShell, "sleep 0.5; echo slow > slow.txt; echo slow"))
	}()
	time.Sleep(150 * time.Millisecond)
	res := call(t, h.socket, request(wire.LanguageShell, "ls -A; echo reset", func(r *wire.Request) { r.Reset = true }))
	if s := <-slow; string(s.Stdout.Data) != "slow\n" || s.ExitCode != 0 {
		t.Fatalf("the running call was disturbed: %s", dump(s))
	}
	if string(res.Stdout.Data) != "reset\n" {
		t.Fatalf("the reset ran before the running call ended, or did not empty %s: %s", h.dir, dump(res))
	}
	if _, err := os.Stat(filepath.Join(h.dir, "slow.txt")); err == nil {
		t.Fatal("slow.txt survived the reset")
	}
}

// TestResetKillsAProcessWithoutItsMainThread: a process whose main thread
// exited shows as a zombie while its other threads run; a reset kills it
// (the sweep of strays is off, as when calls overlap).
func TestResetKillsAProcessWithoutItsMainThread(t *testing.T) {
	t.Setenv(helperKeepStraysEnv, "1")
	h := startHelper(t, true, 0)
	code := `import ctypes, os, threading, time
if os.fork() == 0:
    os.setsid()
    def beat():
        while True:
            with open('alive.txt', 'a') as f:
                f.write('x')
            time.sleep(0.05)
    threading.Thread(target=beat).start()
    time.sleep(0.2)
    ctypes.CDLL(None).syscall(60, 0)  # exit(2) of the main thread only
print('left')
`
	call(t, h.socket, request(wire.LanguagePython, code))
	time.Sleep(500 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(h.dir, "alive.txt")); err != nil {
		t.Fatalf("the thread did not start: %v", err)
	}
	call(t, h.socket, request(wire.LanguageShell, "true", func(r *wire.Request) { r.Reset = true }))
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(h.dir, "alive.txt")); err == nil {
		t.Fatal("a thread of a process whose main thread exited outlived the reset")
	}
}
