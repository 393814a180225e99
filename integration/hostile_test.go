//go:build integration

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Hostile snippets: what a snippet may try against its own
// sandbox's agent, and what a user may do to a sandbox while it works.

// TestHostileSnippetsCannotStopTheAgent tries every way a snippet has to
// signal or trace the agent (PID 1), its zygote and its spares. Each is
// refused, and the sandbox, with its /tmp, answers after each.
func TestHostileSnippetsCannotStopTheAgent(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "k3")
	if res := runIn(t, root, "k3", "echo kept > /tmp/keep", "-l", "shell"); res.code != 0 {
		t.Fatalf("write /tmp/keep: %+v", res)
	}
	checkAlive(t, root, "k3") // a second Python call: the zygote runs from here on
	const zygote = `
import os
def zygote():
    for p in os.listdir('/proc'):
        try:
            if p.isdigit() and '_flmbox_zygote' in open('/proc/%s/cmdline' % p).read():
                return int(p)
        except OSError:
            pass
    raise SystemExit('no zygote found')
`
	// spares lists the shell spares: sh -s processes of the snippets' user
	// that lead their own process group (a call's sh leads its own too,
	// but it is this Python snippet's parent at most).
	const spares = `
import os, signal
def spares():
    out = []
    for p in os.listdir('/proc'):
        try:
            if p.isdigit() and open('/proc/%s/cmdline' % p).read() == 'sh\0-s\0' and os.getpgid(int(p)) == int(p):
                out.append(int(p))
        except OSError:
            pass
    if not out:
        raise SystemExit('no shell spare')
    return out
`
	const try_ = `
def try_(what, f):
    try:
        f()
        print(what, 'WORKED')
    except OSError as e:
        print(what, 'refused')
`
	for _, tc := range []struct {
		name, lang, code string
		refused          int // "refused" lines expected
	}{
		{"SIGSTOP of pid 1", "python", try_ + "import os, signal\ntry_('stop', lambda: os.kill(1, signal.SIGSTOP))", 1},
		{"SIGTERM of pid 1", "python", try_ + "import os, signal\ntry_('term', lambda: os.kill(1, signal.SIGTERM))", 1},
		{"SIGKILL of pid 1", "python", try_ + "import os, signal\ntry_('kill', lambda: os.kill(1, signal.SIGKILL))", 1},
		// The agent's process group is 1: killpg(1) is kill(-1), every
		// process the snippet may signal.
		{"killpg of the agent's group", "python", "import os, signal\nos.killpg(os.getpgid(1), signal.SIGKILL)\nprint('done')", 0},
		{"ptrace attach to pid 1", "python", try_ + `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def attach(pid):
    if libc.ptrace(16, pid, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'ptrace')
try_('ptrace', lambda: attach(1))`, 1},
		{"the zygote stopped, killed and traced", "python", try_ + zygote + `import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
def attach(pid):
    if libc.ptrace(16, pid, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'ptrace')
z = zygote()
try_('stop zygote', lambda: os.kill(z, signal.SIGSTOP))
try_('kill zygote', lambda: os.kill(z, signal.SIGKILL))
try_('ptrace zygote', lambda: attach(z))
os.killpg(os.getpgid(z), signal.SIGKILL)`, 3},
		{"every process stopped then killed", "python", `import os, signal
me = os.getpid()
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) != me:
        for s in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(int(p), s)
            except OSError:
                pass
print('done')`, 0},
		{"kill -9 -1", "shell", "kill -STOP -1; kill -9 -1; echo done", 0},
		// A shell spare runs as the snippets' user: a snippet may stop or
		// trace it, and the next shell call (the subtest's cat) must not
		// take it then.
		{"the shell spare stopped", "python", spares + "for p in spares(): os.kill(p, signal.SIGSTOP)\nprint('done')", 0},
		{"the shell spare traced", "python", spares + `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for p in spares():
    if libc.ptrace(16, p, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'ptrace')
print('done')`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runIn(t, root, "k3", tc.code, "-l", tc.lang, "--timeout", "20s")
			if strings.Contains(res.stdout, "WORKED") || strings.Count(res.stdout, "refused") != tc.refused {
				t.Errorf("exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
			}
			checkAlive(t, root, "k3")
			if res := runIn(t, root, "k3", "cat /tmp/keep", "-l", "shell"); res.code != 0 || res.stdout != "kept\n" {
				t.Fatalf("/tmp after the attack: %+v", res)
			}
		})
	}
	if got := sandboxState(t, root, "k3", "--probe"); got != "running" {
		t.Fatalf("sandbox ls says %q, want running", got)
	}
}

// agentAttempts is Python that tries every way into the agent from inside:
// its socket by path, its descriptors through /proc/1/fd, every socket that
// /proc/net/unix lists, by path and abstract name. Each connection that
// works sends a request to run "touch /tmp/pwned" with no limits.
var agentAttempts = `
import os, socket, json
req = json.dumps({"version": ` + strconv.Itoa(wire.ProtocolVersion) + `, "language": "shell", "code": "touch /tmp/pwned", "timeout_ms": 60000, "limits": {}}).encode()
def attempt(what, addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr)
    except OSError as e:
        return 'refused'
    try:
        s.sendall(req)
        s.shutdown(socket.SHUT_WR)
        print(what, 'CONNECTED', s.recv(200))
    except OSError as e:
        print(what, 'CONNECTED then', e)
    return 'connected'
print('path', attempt('path', '/dev/.flmbox/run/agent.sock'))
try:
    print('fd listing WORKED', os.listdir('/proc/1/fd'))
except OSError:
    print('fd listing refused')
fds = [attempt('fd %d' % n, '/proc/1/fd/%d' % n) for n in range(64)]
print('fds', 'refused' if fds == ['refused'] * 64 else fds)
listed = [l.split()[7] for l in open('/proc/net/unix').read().splitlines()[1:] if len(l.split()) >= 8]
for name in listed:
    addr = '\0' + name[1:] if name.startswith('@') else name
    if attempt('listed ' + name, addr) != 'refused':
        print('listed', name, 'CONNECTED')
print('listed', len(listed), 'sockets')
print('pwned' if os.path.exists('/tmp/pwned') else 'clean')
`

// TestHostileSnippetsCannotReachTheAgentSocket checks that only the host
// speaks to the agent: a snippet that tries every way in gets nowhere, nothing
// runs for it, and its own timeout still ends everything it started.
func TestHostileSnippetsCannotReachTheAgentSocket(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "reach")
	res := runIn(t, root, "reach", agentAttempts)
	if res.code != 0 || strings.Contains(res.stdout, "CONNECTED") || strings.Contains(res.stdout, "WORKED") ||
		!strings.Contains(res.stdout, "path refused\n") || !strings.Contains(res.stdout, "fds refused\n") ||
		!strings.Contains(res.stdout, "\nclean\n") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	// The same from a process that left the call's process group, held
	// open past the call's timeout: it ends with the call.
	script := filepath.Join(t.TempDir(), "attempts.py")
	if err := os.WriteFile(script, []byte(agentAttempts), 0o644); err != nil {
		t.Fatal(err)
	}
	code := fmt.Sprintf("cat > /tmp/attempts.py <<'EOF'\n%sEOF\nsetsid sh -c 'python3 /tmp/attempts.py > /tmp/attempts.out; sleep 1000' &\nsleep 1000", agentAttempts)
	if res := runIn(t, root, "reach", code, "-l", "shell", "--timeout", "5s"); res.code != 124 {
		t.Fatalf("the call that tries from a setsid process: exit %d, want 124 (timeout)\n%s%s", res.code, res.stdout, res.stderr)
	}
	faultNoSnippetProcesses(t, root, "reach")
	res = runIn(t, root, "reach", "cat /tmp/attempts.out; test ! -e /tmp/pwned && echo no-pwned", "-l", "shell")
	if strings.Contains(res.stdout, "CONNECTED") || !strings.Contains(res.stdout, "path refused") || !strings.Contains(res.stdout, "no-pwned") {
		t.Fatalf("from the setsid process: %+v", res)
	}
}

// runscOn runs runsc with the global flags of sandbox name (network none).
func runscOn(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command(runscPath, append([]string{"--root", stateroot.Runsc(root), "--network=none", "--host-uds=create"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runsc %v: %v\n%s", args, err, out)
	}
}

// TestUnresponsiveSandbox stops a sandbox's agent from the host (what a
// SIGSTOP from a snippet did before the agent ran as root): sandbox ls says
// unresponsive, a call fails within seconds saying so, and the sandbox
// answers again once continued.
func TestUnresponsiveSandbox(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "wedged")
	id := sandboxID(t, root, "wedged")
	runscOn(t, root, "kill", id, "SIGSTOP")
	waitState(t, root, "wedged", "unresponsive") // the signal is delivered asynchronously
	// The call's own timeout (10 minutes) is not what ends it: its
	// watchdog is.
	res := runIn(t, root, "wedged", "print(1)", "--timeout", "10m")
	if res.code != 125 || !strings.Contains(res.stderr, "unresponsive") {
		t.Fatalf("a call to the stopped sandbox: %+v", res)
	}
	runscOn(t, root, "kill", id, "SIGCONT")
	waitState(t, root, "wedged", "running")
	checkAlive(t, root, "wedged")
}

// TestCallToARemovedSandbox removes a sandbox while a call runs in it: the
// call says that the sandbox was removed, not that it died.
func TestCallToARemovedSandbox(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "gone")
	cmd := exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "run", "--sandbox", "gone", "--timeout", "5m",
		"-c", "open('/tmp/started', 'w').close()\nimport time\ntime.sleep(300)")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if res := runIn(t, root, "gone", "test -e /tmp/started", "-l", "shell"); res.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call did not start within a minute")
		}
	}
	mustFlmbox(t, root, "sandbox", "rm", "gone")
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 ||
		!strings.Contains(stderr.String(), "was removed") || strings.Contains(stderr.String(), "dead") {
		t.Fatalf("the call whose sandbox was removed: %v\n%s", err, stderr.String())
	}
}

// TestLastRemovalLeavesARemovableRoot checks that once its last sandbox is
// removed, a state root holds no mount and rm -rf removes it.
func TestLastRemovalLeavesARemovableRoot(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	copyPrewarmed(t, root)
	prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())
	createSandbox(t, root, reg, "a")
	createSandbox(t, root, reg, "b")
	if mounts := flmboxMounts(t, root); len(mounts) == 0 {
		t.Fatal("no mount under the root with two sandboxes: the test sees nothing")
	}
	mustFlmbox(t, root, "sandbox", "rm", "a")
	checkAlive(t, root, "b") // the other sandbox's network namespace is still there
	mustFlmbox(t, root, "sandbox", "rm", "b")
	mustFlmbox(t, root, "run", "--image", reg.digestRef(), "-c", "print(1)") // and once more, one-shot
	if mounts := flmboxMounts(t, root); len(mounts) > 0 {
		t.Fatalf("mounts left under the root: %v", mounts)
	}
	if left, _ := filepath.Glob(filepath.Join(stateroot.Runsc(root), "[^.]*")); len(left) > 0 {
		t.Errorf("left in runsc's state directory: %v", left) // but its lock file
	}
	releaseTrees(t, root)
	if err := os.RemoveAll(root); err != nil {
		t.Fatalf("rm -rf the root: %v", err)
	}
}
