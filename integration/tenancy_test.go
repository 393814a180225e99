//go:build integration

package integration

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Tenancy: a sandbox that one user leaves and a reset hands to another
// (the warm pool). See "What a sandbox can hold, and how a reset
// clears it" in docs/ARCHITECTURE.md.

// tenantMess is user A: it leaves, in every form found, what could outlive
// its processes, and prints "keyring refused" (the agent fills the key set
// before any snippet runs) and its daemon's pid.
const tenantMess = `import ctypes, fcntl, os, signal, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.sem_open.restype = ctypes.c_void_p


def ok(r, what):
    assert r is not None and r >= 0, (what, os.strerror(ctypes.get_errno()))
    return r


# Files in /tmp: plain, hidden, in a directory locked to its owner, a FIFO,
# a socket, a symlink.
os.makedirs('/tmp/locked/deep')
open('/tmp/locked/deep/f', 'w').write('A')
os.chmod('/tmp/locked/deep', 0)
os.chmod('/tmp/locked', 0o500)
open('/tmp/top', 'w').write('A')
open('/tmp/.hidden', 'w').write('A')
os.makedirs('/tmp/.hidden-dir')
open('/tmp/.hidden-dir/f', 'w').write('A')
os.mkfifo('/tmp/.fifo')
socket.socket(socket.AF_UNIX).bind('/tmp/.sock')
os.symlink('/etc', '/tmp/link')
# Python: a pip-installed package, a sitecustomize, a .pth, a module that
# shadows the standard library's, pip's cache, the user site (HOME=/tmp).
sp = '/tmp/site-packages'
os.makedirs(sp + '/tenantmod')
open(sp + '/tenantmod/__init__.py', 'w').write('SECRET = "A"\n')
os.makedirs(sp + '/tenantmod-1.0.dist-info')
open(sp + '/tenantmod-1.0.dist-info/METADATA', 'w').write('Metadata-Version: 2.1\nName: tenantmod\nVersion: 1.0\n')
open(sp + '/sitecustomize.py', 'w').write('import os\nos.environ["TENANT_A"] = "sitecustomize"\n')
open(sp + '/tenant.pth', 'w').write('import os; os.environ["TENANT_A"] = "pth"\n')
open('/tmp/json.py', 'w').write('SECRET = "A"\n')
os.makedirs('/tmp/.cache/pip/wheels')
open('/tmp/.cache/pip/wheels/tenantmod-1.0-py3-none-any.whl', 'w').write('A')
usersite = '/tmp/.local/lib/python%d.%d/site-packages' % sys.version_info[:2]
os.makedirs(usersite)
open(usersite + '/usermod.py', 'w').write('SECRET = "A"\n')
# /dev/shm: a file, a hidden one, a POSIX semaphore.
open('/dev/shm/shm-file', 'w').write('A')
open('/dev/shm/.hidden', 'w').write('A')
assert libc.sem_open(b'/tenant-sem', os.O_CREAT, 0o600, 1) not in (None, 2**64 - 1)
# System V IPC, and a segment given away to root (IPC_SET: uid at offset 4).
ok(libc.shmget(0x5eed, 4096, 0o1600), 'shm')
ok(libc.semget(0x5eed, 1, 0o1600), 'sem')
ok(libc.msgget(0x5eed, 0o1600), 'msg')
given = ok(libc.shmget(0x5eee, 4096, 0o1666), 'shm given away')
ds = ctypes.create_string_buffer(256)
ok(libc.shmctl(given, 2, ds), 'IPC_STAT')
struct.pack_into('I', ds, 4, 0)
ok(libc.shmctl(given, 1, ds), 'IPC_SET')
# A POSIX message queue (gVisor implements no mq_send).
ok(libc.mq_open(b'/tenant-queue', os.O_CREAT | os.O_RDWR, 0o666, None), 'mq_open')
# A named keyring that others may search: refused (the key set is full).
k = libc.syscall(250, 1, b'tenant-keyring')
print('keyring', 'refused' if k < 0 else 'made')
# A daemon that left its group and its parent: it holds a lock, an abstract
# name, a port, a mount of its own, and a timer that writes ticks.
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        lock = open('/tmp/.locked-by-daemon', 'w')
        fcntl.flock(lock, fcntl.LOCK_EX)
        name = socket.socket(socket.AF_UNIX)
        name.bind(b'\0tenant-a')
        name.listen()
        port = socket.socket()
        port.bind(('127.0.0.1', 45111))
        port.listen()
        os.makedirs('/tmp/mnt')
        ok(libc.unshare(0x10000000 | 0x00020000), 'unshare')
        ok(libc.mount(b'tmpfs', b'/tmp/mnt', b'tmpfs', 0, None), 'mount')
        signal.signal(signal.SIGALRM, lambda *a: open('/dev/shm/tick', 'a').write('x'))
        signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
        signal.pause()  # the first tick: the call may end, and its strays be killed, at once
        os.write(w, b'%d' % os.getpid())
        while True:
            signal.pause()
    os._exit(0)
print('daemon', os.read(r, 32).decode())
`

// tenantCheck looks for everything tenantMess leaves and prints, as JSON,
// what it found ("left"), the agent's start time (field 22 of /proc/1/stat)
// and what a snippet's Python sees of its sandbox ("view"), to compare with
// a new sandbox's.
const tenantCheck = `import ctypes, errno, importlib, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.sem_open.restype = ctypes.c_void_p
left = ['/tmp/' + n for n in sorted(os.listdir('/tmp'))] + ['/dev/shm/' + n for n in sorted(os.listdir('/dev/shm'))]
# IPC_CREAT|IPC_EXCL succeeds only if no object has the key.
for what, id in [('shm', libc.shmget(0x5eed, 4096, 0o3600)), ('sem', libc.semget(0x5eed, 1, 0o3600)),
                 ('msg', libc.msgget(0x5eed, 0o3600)), ('shm given away', libc.shmget(0x5eee, 4096, 0o3600))]:
    if id < 0:
        left.append(what)
if libc.mq_open(b'/tenant-queue', os.O_RDONLY, 0, None) >= 0 or ctypes.get_errno() != errno.ENOENT:
    left.append('mqueue')
if libc.sem_open(b'/tenant-sem', 0) not in (None, 2**64 - 1):
    left.append('semaphore')
if libc.syscall(250, 1, b'tenant-keyring') >= 0 or ctypes.get_errno() != errno.EDQUOT:
    left.append('keyring')
for what, fam, addr in [('@tenant-a', socket.AF_UNIX, b'\0tenant-a'), ('port 45111', socket.AF_INET, ('127.0.0.1', 45111))]:
    try:
        socket.socket(fam).bind(addr)
    except OSError:
        left.append(what)
# Processes of the snippets' user but this one and its parent; a shell spare
# (sh -s, leading its own group in the agent's session) is the agent's.
me = os.getpid()
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) in (1, me, os.getppid()):
        continue
    try:
        stat = open('/proc/%s/stat' % p).read()
        state, ppid, pgrp, sid = stat[stat.rindex(')') + 2:].split()[:4]
        uid = [l.split()[1] for l in open('/proc/%s/status' % p) if l.startswith('Uid:')][0]
        cmd = open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\0', b' ').decode().strip()
    except (OSError, IndexError, ValueError):
        continue
    if uid == '0' or state == 'Z' or pgrp == p and sid != p and cmd == 'sh -s':
        continue
    left.append('process %s %s' % (p, cmd))
for m in ['tenantmod', 'usermod']:
    try:
        __import__(m)
        left.append('module ' + m)
    except ImportError:
        pass
json = importlib.import_module('json')
if json.__file__.startswith('/tmp/'):
    left.append('json.py')
    del sys.modules['json']
    path, sys.path[:] = sys.path[:], [p for p in sys.path if p and not p.startswith('/tmp')]
    json = importlib.import_module('json')
    sys.path[:] = path
if 'TENANT_A' in os.environ:
    left.append('TENANT_A=' + os.environ['TENANT_A'])
stat = open('/proc/1/stat').read()
view = {
    'sys.path': sys.path,
    # Each sandbox has its own host name (the same after a reset).
    'environ': sorted((k, 'its host name' if k == 'HOSTNAME' and v == os.uname().nodename else v) for k, v in os.environ.items()),
    'modules': sorted(sys.modules),
    'mounts': open('/proc/self/mountinfo').read(),
    'cgroup': open('/proc/self/cgroup').read(),
    'cwd': os.getcwd(),
}
print(json.dumps({'left': left, 'agent_start': stat[stat.rindex(')') + 2:].split()[19], 'view': view}))
`

// tenantAttempts tries what a snippet cannot do to its sandbox, so that
// nothing of it can outlive the snippet: it prints the attempts that were
// not refused, and the paths it can write outside /tmp and /dev/shm.
const tenantAttempts = `import ctypes, os, stat
libc = ctypes.CDLL(None, use_errno=True)


def refused(f):
    try:
        return f() < 0
    except OSError:
        return True


def cgroup():
    # In a user and mount namespace of its own a snippet may mount a cgroup
    # hierarchy; its cgroups are root's.
    pid = os.fork()
    if pid == 0:
        ok = libc.unshare(0x10000000 | 0x00020000) == 0 and libc.mount(b'cgroup', b'/tmp/cg', b'cgroup', 0, b'memory') == 0
        for f in [lambda: os.mkdir('/tmp/cg/tenant'), lambda: open('/tmp/cg/memory.limit_in_bytes', 'w').write('1')]:
            try:
                f()
                ok = False
            except OSError:
                pass
        os._exit(0 if ok else 1)
    return -1 if os.waitpid(pid, 0)[1] == 0 else 0


os.makedirs('/tmp/cg')
rl = (ctypes.c_ulong * 2)(1, 1)
attempts = {
    'sysctl': lambda: open('/proc/sys/kernel/hostname', 'w').write('tenant-a'),
    'sethostname': lambda: libc.sethostname(b'tenant-a', 8),
    'rlimit of pid 1': lambda: libc.prlimit(1, 7, rl, None),
    'oom_score_adj of pid 1': lambda: open('/proc/1/oom_score_adj', 'w').write('1000'),
    'cgroup': cgroup,
}
for d in ['/var/tmp', '/run/lock', '/run', '/root', '/home', '/dev', '/dev/.flmbox', '/dev/pts', '/etc']:
    attempts['file in ' + d] = lambda d=d: open(d + '/tenant-a', 'w').write('A')
print('not refused:', sorted(k for k, f in attempts.items() if not refused(f)))
writable = []
for top, dirs, files in os.walk('/'):
    if top in ('/proc', '/sys'):
        dirs[:] = []
        continue
    for n in dirs + files:
        p = os.path.join(top, n)
        try:
            mode = os.lstat(p).st_mode
        except OSError:
            continue
        if not (stat.S_ISLNK(mode) or stat.S_ISCHR(mode)) and os.access(p, os.W_OK) and not p.startswith(('/tmp/', '/dev/shm/')):
            writable.append(p)
print('writable', writable)
`

// tenantView is tenantCheck's output.
type tenantView struct {
	Left       []string       `json:"left"`
	AgentStart string         `json:"agent_start"`
	View       map[string]any `json:"view"`
}

func checkTenant(t *testing.T, root, name string, args ...string) tenantView {
	t.Helper()
	res := runIn(t, root, name, tenantCheck, args...)
	var v tenantView
	if err := json.Unmarshal([]byte(res.stdout), &v); err != nil || res.code != 0 {
		t.Fatalf("check %s %v: exit %d: %v\nstdout: %s\nstderr: %s", name, args, res.code, err, res.stdout, res.stderr)
	}
	return v
}

// TestTenancyResetLeavesNothing is the tenancy test on a sandbox of
// its own: user A leaves files in /tmp (hidden ones, a locked directory, a
// file locked by a daemon), in /dev/shm (a POSIX semaphore), System V and
// POSIX IPC objects, a setsid daemon holding an abstract name, a port, a
// mount of its own and a timer, a pip-installed package, a sitecustomize.py
// and a .pth in /tmp/site-packages, a json.py that shadows the standard
// library's, pip's cache and the user site; without a reset the check finds
// them (the daemon is gone already: the agent kills strays once no call
// runs). User B, after run --reset, is in the same sandbox (the runsc
// container and the agent's start time unchanged), finds none of them, and
// sees what a snippet of a new sandbox of the same image sees (sys.path,
// environment, modules, mounts, cgroup, working directory); its own package
// imports.
func TestTenancyResetLeavesNothing(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "tenant")
	createSandbox(t, root, reg, "new")
	id := sandboxID(t, root, "tenant")

	// User A.
	if res := runIn(t, root, "tenant", tenantAttempts); res.code != 0 || res.stdout != "not refused: []\nwritable ['/tmp', '/dev/shm']\n" {
		t.Fatalf("attempts: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res := runIn(t, root, "tenant", tenantMess)
	if res.code != 0 || !strings.HasPrefix(res.stdout, "keyring refused\ndaemon ") {
		t.Fatalf("user A: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// Spares and the zygote of A's calls, which the reset must replace.
	runIn(t, root, "tenant", "print(1)")
	runIn(t, root, "tenant", "echo 1", "-l", "shell")
	a := checkTenant(t, root, "tenant")
	for _, want := range []string{"/tmp/.cache", "/tmp/.fifo", "/tmp/.hidden", "/tmp/.hidden-dir", "/tmp/.local", "/tmp/.locked-by-daemon",
		"/tmp/.sock", "/tmp/json.py", "/tmp/link", "/tmp/locked", "/tmp/mnt", "/tmp/site-packages", "/tmp/top",
		"/dev/shm/.hidden", "/dev/shm/sem.tenant-sem", "/dev/shm/shm-file", "/dev/shm/tick",
		"shm", "sem", "msg", "shm given away", "mqueue", "semaphore", "module tenantmod", "json.py"} {
		if !slices.Contains(a.Left, want) {
			t.Errorf("without a reset, the check does not find %q: %q", want, a.Left)
		}
	}

	// User B.
	b := checkTenant(t, root, "tenant", "--reset")
	if len(b.Left) != 0 {
		t.Errorf("after the reset, user B finds %q", b.Left)
	}
	if b.AgentStart != a.AgentStart || sandboxID(t, root, "tenant") != id {
		t.Errorf("not the same sandbox: the agent started at %s, then %s; runsc container %s, then %s",
			a.AgentStart, b.AgentStart, id, sandboxID(t, root, "tenant"))
	}
	n := checkTenant(t, root, "new")
	if len(n.Left) != 0 {
		t.Errorf("a new sandbox holds %q", n.Left)
	}
	for k, v := range n.View {
		if !reflect.DeepEqual(b.View[k], v) {
			t.Errorf("%s after the reset:\n%v\nin a new sandbox:\n%v", k, b.View[k], v)
		}
	}
	// B's own package, made as pip would make it, imports.
	own := `import os
os.makedirs('/tmp/site-packages/bmod')
open('/tmp/site-packages/bmod/__init__.py', 'w').write('WHO = "B"\n')
import bmod, json
print(bmod.WHO, json.dumps([1]))
`
	if res := runIn(t, root, "tenant", own); res.code != 0 || res.stdout != "B [1]\n" {
		t.Errorf("user B's package: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// TestTenancyResetRefusesStrandedSockets: a snippet that leaves a cycle of
// descriptors in flight (a Unix socket whose queue holds itself, and an
// abstract listener) leaves sockets that no process holds and nothing can
// free in gVisor: every reset of that sandbox fails, naming them, and the
// sandbox runs on.
func TestTenancyResetRefusesStrandedSockets(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "stranded")
	cycle := `import array, socket
listener = socket.socket(socket.AF_UNIX)
listener.bind(b'\0tenant-cycle')
listener.listen()
a, b = socket.socketpair()
a.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [listener.fileno(), b.fileno()]))])
print('cycle')
`
	if res := runIn(t, root, "stranded", cycle); res.code != 0 || res.stdout != "cycle\n" {
		t.Fatalf("cycle: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	for range 2 {
		res := runIn(t, root, "stranded", "print('ran')", "--reset")
		if res.code == 0 || res.stdout != "" || !strings.Contains(res.stderr, "held by no process") || !strings.Contains(res.stderr, "unix @tenant-cycle") {
			t.Fatalf("reset with a cycle in flight: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
		}
	}
	checkAlive(t, root, "stranded")
	if state := sandboxState(t, root, "stranded", "--probe"); state != "running" {
		t.Errorf("the sandbox is %s", state)
	}
}
