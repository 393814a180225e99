//go:build integration

package integration

import (
	"strings"
	"testing"
	"time"
)

// Python's children: what a snippet's Python starts is an ordinary python3,
// and what Python leaves to its resource tracker is cleaned up as on a bare
// machine.

// mpFlags prints, for a worker of each of multiprocessing's start methods
// that fork nothing of the snippet's own interpreter, its sys.flags.no_site
// and no_user_site and the user it runs as.
const mpFlags = `import multiprocessing as mp
probe = "__import__('sys').flags.no_site, __import__('sys').flags.no_user_site, __import__('os').getuid()"
for method in ('spawn', 'forkserver'):
    with mp.get_context(method).Pool(2) as pool:
        print(method, *pool.apply(eval, (probe,)))
`

// TestPythonChildrenAreOrdinary: multiprocessing's spawn and forkserver
// workers run with site on (no_site 0, no_user_site 0), as the snippets'
// user, in a python3 spare, a zygote's child and after a reset, and nothing
// of the resource tracker's complaints reaches stderr (a tracker started
// with -S -s died, and was relaunched with a warning, where it imported
// what only site's directories have).
func TestPythonChildrenAreOrdinary(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "mp")
	want := "spawn 0 0 65534\nforkserver 0 0 65534\n"
	for i, args := range [][]string{nil, nil, nil, {"--reset"}} { // a python3, the zygote's children, a reset's python3
		res := runIn(t, root, "mp", mpFlags, args...)
		if res.code != 0 || res.stdout != want || strings.Contains(res.stderr, "resource_tracker") || res.stderr != "" {
			t.Fatalf("call %d %v: exit %d stdout %q stderr %q, want %q", i, args, res.code, res.stdout, res.stderr, want)
		}
	}
	// The snippet's own Python too, and a python3 it starts.
	out := mustFlmbox(t, root, "run", "--sandbox", "mp", "-c",
		"import subprocess, sys\nprint(sys.flags.no_site, sys.flags.no_user_site)\n"+
			"subprocess.run([sys.executable, '-c', 'import sys; print(sys.flags.no_site, sys.flags.no_user_site)'])")
	if out != "0 0\n0 0\n" {
		t.Fatalf("the snippet's flags, then its python3's: %q", out)
	}
}

// TestLeakedSharedMemoryIsRemoved: a snippet that makes a
// multiprocessing.shared_memory segment and exits without unlinking it
// leaves it to Python's resource tracker, as on a bare machine; the agent
// lets the tracker run after the snippet's end (it used to kill it with the
// snippet's process group, and the segment stayed in /dev/shm into the next
// calls). Each time in a python3 spare and in a zygote's child.
func TestLeakedSharedMemoryIsRemoved(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "shm")
	for i := 0; i < 3; i++ {
		res := runIn(t, root, "shm", "from multiprocessing import shared_memory\n"+
			"s = shared_memory.SharedMemory(create=True, size=1 << 20)\ns.buf[0] = 1\nprint(s.name)\n")
		name := strings.TrimSpace(res.stdout)
		if res.code != 0 || !strings.HasPrefix(name, "psm_") {
			t.Fatalf("call %d: exit %d stdout %q stderr %q", i, res.code, res.stdout, res.stderr)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			out := mustFlmbox(t, root, "run", "--sandbox", "shm", "-l", "shell", "-c", "ls -A /dev/shm")
			if !strings.Contains(out, name) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("call %d: /dev/shm still holds %s: %q", i, name, out)
			}
		}
	}
}

// plantUserSite is a snippet that plants, in the user site under HOME=/tmp,
// a .pth file whose code marks where it ran: /tmp/ran-UID-PID always, and
// /dev/flmbox-ran-UID-PID, which only root can make.
const plantUserSite = `import os, sys
payload = """
import os
for d in ('/dev', '/tmp'):
    try:
        open('%s/%sran-%d-%d' % (d, 'flmbox-' if d == '/dev' else '', os.getuid(), os.getpid()), 'w').close()
    except OSError:
        pass
"""
user = '/tmp/.local/lib/python%d.%d/site-packages' % sys.version_info[:2]
os.makedirs(user, exist_ok=True)
open(user + '/x.pth', 'w').write('import os; exec(%r)\n' % payload)
print('planted')
`

// TestPlantedUserSiteNeverRunsAsRoot: the agent's Python processes start as
// root with site on (the zygote, python3 spares, the python3 a reset takes);
// a .pth file a snippet planted in the user site must run in none of them
// then, only in the snippets' own processes, as their user, once they have
// read their code (as python3 would run it).
func TestPlantedUserSiteNeverRunsAsRoot(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "plant")
	checkAlive(t, root, "plant")
	for round := 0; round < 2; round++ {
		// The first call after a reset plants; the zygote starts after it,
		// then the python3 that the next reset takes (the reserve).
		res := runIn(t, root, "plant", plantUserSite, "--reset")
		if res.code != 0 || res.stdout != "planted\n" {
			t.Fatalf("round %d: planting: exit %d stdout %q stderr %q", round, res.code, res.stdout, res.stderr)
		}
		for i := 0; i < 3; i++ {
			res := runIn(t, root, "plant", "import os, sys\nprint(sys.path[5], sorted(f.split('-')[1] for f in os.listdir('/tmp') if f.startswith('ran-')))\n"+
				"parent = open('/proc/%d/cmdline' % os.getppid()).read()\nprint('zygote' if '_flmbox_zygote' in parent else 'python3')")
			if res.code != 0 || res.stdout != "/tmp/.local/lib/python3.11/site-packages ['65534']\nzygote\n" {
				t.Fatalf("round %d, call %d after planting: exit %d stdout %q stderr %q", round, i, res.code, res.stdout, res.stderr)
			}
			mustFlmbox(t, root, "run", "--sandbox", "plant", "-l", "shell", "-c", "rm -f /tmp/ran-*")
		}
	}
	mustFlmbox(t, root, "run", "--sandbox", "plant", "--reset", "-c", "pass")
	if out := mustFlmbox(t, root, "run", "--sandbox", "plant", "-l", "shell", "-c", "ls /dev | grep ran- || true"); out != "" {
		t.Fatalf("the planted .pth ran as root: %q", out)
	}
}
