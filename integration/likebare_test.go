//go:build integration

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// Code runs as under bare gVisor: the limits flmbox adds measure
// what they say (--memory what is used, not address space; --pids processes
// and threads, all calls together), and a sandbox has a container's /etc and
// environment.

// TestLimitsMeasureWhatTheySay runs, in a sandbox with the default limits,
// what an address-space limit or a quarter of --pids refused: many threads,
// a thread pool, a large read-only map, many processes at once, also right
// after a call that left as many behind. (Forked Pythons cost some 5 MiB
// each under gVisor: TestMemoryCountsWhatTheSandboxUses.)
func TestLimitsMeasureWhatTheySay(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "lim")
	for _, tc := range []struct{ name, lang, code, want string }{
		{"200 threads alive at once", "python", `
import threading
ev = threading.Event()
ts = [threading.Thread(target=ev.wait) for _ in range(200)]
for t in ts:
    t.start()
print(threading.active_count())
ev.set()
for t in ts:
    t.join()
`, "201\n"},
		{"ThreadPoolExecutor(64) runs 64 tasks at once", "python", `
import threading
from concurrent.futures import ThreadPoolExecutor
b = threading.Barrier(64)
with ThreadPoolExecutor(64) as ex:
    print(sorted(set(ex.map(lambda _: b.wait(60) >= 0, range(64)))))
`, "[True]\n"},
		{"a 4 GiB sparse file mapped read-only", "python", `
import mmap, os
with open('/tmp/sparse', 'wb') as f:
    f.truncate(4 << 30)
fd = os.open('/tmp/sparse', os.O_RDONLY)
m = mmap.mmap(fd, 4 << 30, prot=mmap.PROT_READ)
print(len(m) == 4 << 30, m[0], m[(2 << 30) + 1], m[(4 << 30) - 1])
m.close()
os.close(fd)
os.remove('/tmp/sparse')
`, "True 0 0 0\n"},
		{"200 processes alive in one call", "python", spawnN(200, false), "200\n"},
		{"a call leaves 200 daemons behind", "python", spawnN(200, true), "200\n"},
		// What it left is gone before the next call runs: that call can
		// have as many again.
		{"the next call has 200 processes again", "python", spawnN(200, false), "200\n"},
		{"a shell with 200 jobs", "shell", `pids=; for i in $(seq 200); do sleep 600 & pids="$pids $!"; done; grep -lx sleep /proc/[0-9]*/comm | wc -l; kill $pids`, "200\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runIn(t, root, "lim", tc.code, "-l", tc.lang, "--timeout", "2m")
			if res.code != 0 || res.stdout != tc.want {
				t.Fatalf("exit %d, stdout %q (want %q), stderr %s", res.code, res.stdout, tc.want, res.stderr)
			}
		})
	}
	// --pids bounds processes and threads: past it, fork and thread
	// creation fail in the snippet (EAGAIN), and the sandbox lives.
	createSandbox(t, root, reg, "few", "--pids", "64")
	res := runIn(t, root, "few", `
import os, threading, time
ev = threading.Event()
n = 0
try:
    for _ in range(200):
        threading.Thread(target=ev.wait).start()
        n += 1
except RuntimeError as e:
    print('threads', n + 1, e)
ev.set()
`, "--timeout", "1m")
	// 63 threads and the main thread; a shell spare of the snippets' user
	// may take one, and gVisor counts a process in the user it was made
	// by (the snippet's Python was made by root, then became the user).
	if res.code != 0 || !slices.ContainsFunc([]string{"63", "64", "65"}, func(n string) bool {
		return strings.HasPrefix(res.stdout, "threads "+n+" can't start new thread")
	}) {
		t.Fatalf("threads past --pids 64: exit %d stdout %q stderr %s", res.code, res.stdout, res.stderr)
	}
	checkAlive(t, root, "few")
	if n := sandboxPidsMax(t, root, "few"); n != 0 {
		t.Fatalf("the sandbox's pids cgroup refused %d tasks", n)
	}
}

// spawnN is Python that starts n sleep processes, prints how many are
// alive at once, and ends them; with daemons, each in a session of its own
// (setsid), left running.
func spawnN(n int, daemons bool) string {
	return `
import subprocess
n, daemons = ` + strconv.Itoa(n) + `, ` + map[bool]string{true: "True", false: "False"}[daemons] + `
ps = [subprocess.Popen(['sleep', '600'], start_new_session=daemons) for _ in range(n)]
print(sum(p.poll() is None for p in ps))
if not daemons:
    for p in ps:
        p.kill()
        p.wait()
`
}

// TestMemoryCountsWhatTheSandboxUses: the memory watch counts a forked
// child's pages shared with its parent once, and an allocation past --memory
// is stopped by the watch (no address-space limit): the snippet is killed
// as out of memory and the sandbox lives.
func TestMemoryCountsWhatTheSandboxUses(t *testing.T) {
	// Not parallel: the agent's memory watch must stop the snippet before the host's cgroup does.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	// gVisor copies a page shared after fork 2 MiB at a time, so that
	// each child costs some 5 MiB of the sandbox's memory: 100 children
	// of a parent holding 40 MiB use some 550 MiB, while their resident
	// figures add up to over 4 GiB.
	createSandbox(t, root, reg, "mem", "--memory", "1GiB")
	res := runIn(t, root, "mem", `
import os, time
data = bytearray(40 << 20)
for i in range(0, len(data), 4096):
    data[i] = 1
kids = []
for _ in range(100):
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print('ok', len(kids))
`, "--timeout", "2m")
	if res.code != 0 || res.stdout != "ok 100\n" {
		t.Fatalf("100 forked children: exit %d stdout %q stderr %s", res.code, res.stdout, res.stderr)
	}
	for _, code := range []string{"x = b'x' * (2 << 30)", "x = bytearray(3 << 30)\nx[::4096] = b'y' * len(range(0, 3 << 30, 4096))"} {
		res := runIn(t, root, "mem", code, "--timeout", "1m")
		if res.code != 137 || !strings.Contains(res.stderr, "running out of memory") {
			t.Fatalf("%q: exit %d stdout %q stderr %s, want killed as out of memory", code, res.code, res.stdout, res.stderr)
		}
		checkAlive(t, root, "mem")
	}
	if n := sandboxOOMKills(t, root, "mem"); n != 0 {
		t.Fatalf("the sandbox's memory cgroup counted %d OOM kills", n)
	}
}

// TestContainerEnvironment: a sandbox has /etc/hosts, /etc/hostname and,
// with the host's network, the host's /etc/resolv.conf, as a docker
// container has, bound over the image's without changing the cached tree;
// localhost resolves; and what flmbox needs for itself (unbuffered output,
// its bootstrap variables) never reaches what a snippet starts.
func TestContainerEnvironment(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	tree := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef()).Rootfs
	// The tree's files are links shared with other roots (their link
	// counts come and go): what is compared is treeDigest's, and
	// TestSandboxesLeaveTheCachedTreeUntouched looks at every inode.
	digest := func() string {
		t.Helper()
		d, err := treeDigest(tree)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	before := digest()
	createSandbox(t, root, reg, "env")
	host := sandboxID(t, root, "env")[len("flmbox-"):][:12]
	check := func(name, code, want string) {
		t.Helper()
		res := runIn(t, root, name, code)
		if res.code != 0 || res.stdout != want {
			t.Fatalf("%s: exit %d stdout %q, want %q; stderr %s", name, res.code, res.stdout, want, res.stderr)
		}
	}
	check("env", `
import socket
print(socket.gethostbyname('localhost'), socket.gethostname(), socket.gethostbyname(socket.gethostname()))
print(socket.getaddrinfo('localhost', 80, socket.AF_INET6)[0][4][0])
print(open('/etc/hostname').read().strip(), '127.0.0.1\tlocalhost' in open('/etc/hosts').read())
`, "127.0.0.1 "+host+" 127.0.1.1\n::1\n"+host+" True\n")
	// The snippets cannot change them.
	check("env", `
for p in ('/etc/hosts', '/etc/hostname'):
    try:
        open(p, 'a')
        print(p, 'WRITABLE')
    except OSError:
        print(p, 'refused')
`, "/etc/hosts refused\n/etc/hostname refused\n")
	// What a snippet starts sees none of flmbox's own settings.
	const childEnv = `python3 -c "import os, sys; print(sorted(k for k in os.environ if k.startswith(('PYTHONUNBUFFERED', 'FLMBOX_PYTHONPATH'))), sys.stdout.line_buffering, sys.stdout.write_through)" | cat`
	res := runIn(t, root, "env", childEnv, "-l", "shell")
	if res.code != 0 || res.stdout != "[] False False\n" {
		t.Fatalf("a child Python's environment: exit %d stdout %q stderr %s", res.code, res.stdout, res.stderr)
	}
	res = runIn(t, root, "env", "import subprocess, sys\nprint(subprocess.run(["+"'sh', '-c', "+strings.ReplaceAll(pyQuote(childEnv), "\n", "")+"], capture_output=True, text=True).stdout, end='')")
	if res.code != 0 || res.stdout != "[] False False\n" {
		t.Fatalf("a Python snippet's child's environment: exit %d stdout %q stderr %s", res.code, res.stdout, res.stderr)
	}
	// The snippet's own output is unbuffered: what it printed before it
	// was killed is in the result.
	res = runIn(t, root, "env", "import os, time\nprint('before', flush=False)\nos.kill(os.getpid(), 9)")
	if res.stdout != "before\n" {
		t.Fatalf("output before a kill: exit %d stdout %q stderr %s", res.code, res.stdout, res.stderr)
	}
	// With the host's network, the host's resolver configuration.
	hostResolv, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		t.Fatalf("this host has no /etc/resolv.conf: %v", err)
	}
	createSandbox(t, root, reg, "envhost", "--network", "host")
	check("envhost", "print(open('/etc/resolv.conf').read(), end='')", string(hostResolv))
	check("envhost", "import socket\nprint(socket.gethostbyname('localhost'))", "127.0.0.1\n")
	// Without a network, the image's own.
	imageResolv, err := os.ReadFile(filepath.Join(tree, "etc/resolv.conf"))
	if err != nil {
		t.Fatal(err)
	}
	check("env", "print(open('/etc/resolv.conf').read(), end='')", string(imageResolv))
	// None of it went into the tree that sandboxes share: the image has no
	// /etc/hosts, and the image cache made its mount point, empty.
	for _, name := range []string{"env", "envhost"} {
		mustFlmbox(t, root, "sandbox", "rm", name)
	}
	if digest() != before {
		t.Fatalf("sandboxes changed the cached tree")
	}
	if fi, err := os.Lstat(filepath.Join(tree, "etc/hosts")); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Errorf("the cached tree's /etc/hosts: %v %v, want the empty mount point", fi, err)
	}
}

// pyQuote is s as a Python string literal.
func pyQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// TestContainerEnvironmentAfterAdoptionAndResume: a sandbox adopted from the
// pool (its directory renamed) keeps its /etc files through a suspend and
// resume: the restore binds them from the directory it has now.
func TestContainerEnvironmentAfterAdoptionAndResume(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	fillPool(t, root, reg.digestRef(), 1)
	createSandbox(t, root, reg, "adopted")
	host := sandboxID(t, root, "adopted")[len("flmbox-"):][:12]
	const code = "import socket\nprint(socket.gethostname(), socket.gethostbyname(socket.gethostname()), open('/etc/hostname').read().strip())"
	want := host + " 127.0.1.1 " + host + "\n"
	if res := runIn(t, root, "adopted", code); res.code != 0 || res.stdout != want {
		t.Fatalf("adopted: exit %d stdout %q, want %q; stderr %s", res.code, res.stdout, want, res.stderr)
	}
	var spec struct {
		Mounts []struct{ Destination, Source string }
	}
	b, err := os.ReadFile(filepath.Join(stateroot.Sandbox(root, "adopted"), "config.json"))
	if err != nil || json.Unmarshal(b, &spec) != nil {
		t.Fatalf("the adopted sandbox's bundle: %v", err)
	}
	renamed := false
	for _, m := range spec.Mounts {
		if m.Destination == "/etc/hosts" {
			renamed = !strings.HasPrefix(m.Source, stateroot.Sandbox(root, "adopted")+"/")
		}
	}
	if !renamed {
		t.Fatal("the adopted sandbox was made under its own name: no pooled sandbox was adopted")
	}
	mustFlmbox(t, root, "sandbox", "suspend", "adopted")
	if res := runIn(t, root, "adopted", code); res.code != 0 || res.stdout != want {
		t.Fatalf("resumed: exit %d stdout %q, want %q; stderr %s", res.code, res.stdout, want, res.stderr)
	}
}
