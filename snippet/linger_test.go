package snippet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
)

// leakShm is a snippet that makes a POSIX shared memory segment through
// multiprocessing (its resource tracker then watches it), prints its name
// and exits without unlinking it, as bare python3 leaves it to the tracker.
const leakShm = "from multiprocessing import shared_memory\n" +
	"s = shared_memory.SharedMemory(create=True, size=4096)\nprint(s.name)\n"

// TestLingerLetsTheResourceTrackerClean: a snippet that leaks a shared
// memory segment and exits leaves its process group a grace, in which
// multiprocessing's resource tracker (which ignores SIGTERM) removes the
// segment, as it does after python3 on a bare machine; killed with the group
// at once, it left it in /dev/shm. So in a python3 of the agent's and in a
// zygote's child, and the next call runs meanwhile.
func TestLingerLetsTheResourceTrackerClean(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm here")
	}
	a := testAgent(t)
	a.Spares = true
	t.Cleanup(func() { a.Close() })
	for i := 0; i < 3; i++ { // a python3, then the zygote's children
		res := run(t, a, request(wire.LanguagePython, leakShm))
		name := strings.TrimSpace(string(res.Stdout.Data))
		// The tracker's warning about the leak comes after the snippet's
		// end, in its stderr or not: never one that the tracker died.
		if res.ExitCode != 0 || !strings.HasPrefix(name, "psm_") || strings.Contains(string(res.Stderr.Data), "died") {
			t.Fatalf("call %d: %s", i, dump(res))
		}
		seg := filepath.Join("/dev/shm", name)
		t.Cleanup(func() { os.Remove(seg) })
		if res := run(t, a, request(wire.LanguageShell, "echo next")); string(res.Stdout.Data) != "next\n" {
			t.Fatalf("the next call: %s", dump(res))
		}
		for deadline := time.Now().Add(guard); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(seg); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("call %d: %s is still there: the resource tracker did not remove it", i, seg)
			}
		}
	}
	// A worker that multiprocessing spawns is an ordinary python3.
	res := run(t, a, request(wire.LanguagePython, "import multiprocessing as mp\n"+
		"for method in ('spawn', 'forkserver'):\n"+
		"    with mp.get_context(method).Pool(1) as pool:\n"+
		"        print(method, pool.apply(eval, ('__import__(\"sys\").flags.no_site, __import__(\"sys\").flags.no_user_site',)))\n"))
	if res.ExitCode != 0 || string(res.Stdout.Data) != "spawn (0, 0)\nforkserver (0, 0)\n" || len(res.Stderr.Data) != 0 {
		t.Fatalf("multiprocessing's workers: %s", dump(res))
	}
}

// TestLingerEndsWithTheGroup: a process that left the snippet's group
// (setsid) and holds its output pipes does not hold the group's grace: it
// ends once the group is empty, and the call's answer never waited for it.
func TestLingerEndsWithTheGroup(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	res := run(t, a, request(wire.LanguagePython, "import subprocess\nprint(subprocess.Popen(['sleep', '1000'], start_new_session=True).pid)"))
	ps := pids(t, res)
	t.Cleanup(func() {
		for _, pid := range ps {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
	a.lingerMu.Lock()
	var p *proc
	for q := range a.lingering {
		p = q
	}
	a.lingerMu.Unlock()
	if p == nil {
		t.Fatal("the call's process is not lingering")
	}
	select {
	case <-p.quiet:
		t.Fatal("the pipes reached their end: the escaped process does not hold them")
	case <-p.done:
	case <-time.After(guard):
		t.Fatal("the grace did not end")
	}
	select {
	case <-p.quiet:
		t.Fatal("the pipes reached their end: the escaped process does not hold them")
	case <-p.cut:
		t.Fatal("cut")
	default:
	}
}
