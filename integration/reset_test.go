//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// messCode leaves behind, in a sandbox, everything a reset must clear:
// files in /tmp (one directory locked), a file in /dev/shm, System V shared
// memory, a semaphore set and a message queue, and a daemon that left its
// process group and its parent (which the agent kills once no call runs,
// reset or not).
const messCode = `import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs('/tmp/locked/deep')
open('/tmp/locked/deep/f', 'w').write('x')
os.chmod('/tmp/locked/deep', 0)
os.chmod('/tmp/locked', 0o500)
open('/tmp/top', 'w').write('y')
open('/dev/shm/shm-file', 'w').write('z')
for what, id in [('shm', libc.shmget(0x5eed, 4096, 0o1600)), ('sem', libc.semget(0x5eed, 1, 0o1600)), ('msg', libc.msgget(0x5eed, 0o1600))]:
    assert id >= 0, (what, ctypes.get_errno())
subprocess.Popen(['sleep', '1000'], start_new_session=True)
print('messy')
`

// checkClean asserts that a sandbox holds nothing of messCode: it runs in
// the state the sandbox is in.
const checkClean = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
left = sorted(os.listdir('/tmp')) + sorted(os.listdir('/dev/shm'))
# IPC_CREAT|IPC_EXCL succeeds only if no object has the key any more.
for what, id in [('shm', libc.shmget(0x5eed, 4096, 0o3600)), ('sem', libc.semget(0x5eed, 1, 0o3600)), ('msg', libc.msgget(0x5eed, 0o3600))]:
    if id < 0:
        left.append(what)
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            stat = open('/proc/%s/stat' % pid).read()
            if stat[stat.index('(') + 1:stat.rindex(')')] == 'sleep' and stat[stat.rindex(')') + 2] != 'Z':
                left.append('sleep %s' % pid)
        except OSError:
            pass
print('left:', left)
`

// TestResetReturnsASandboxToNew checks run --reset on a persistent sandbox:
// without it files and IPC objects stay (processes do not, daemons
// included); with it none of them.
func TestResetReturnsASandboxToNew(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "reuse")
	if res := runIn(t, root, "reuse", messCode); res.code != 0 || res.stdout != "messy\n" {
		t.Fatalf("mess: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res := runIn(t, root, "reuse", checkClean)
	for _, want := range []string{"'locked'", "'top'", "'shm-file'", "'shm'", "'sem'", "'msg'"} {
		if !strings.Contains(res.stdout, want) {
			t.Fatalf("without --reset, %s should be left: %s%s", want, res.stdout, res.stderr)
		}
	}
	if strings.Contains(res.stdout, "'sleep ") {
		t.Fatalf("the daemon outlived its call: %s%s", res.stdout, res.stderr)
	}
	res = runIn(t, root, "reuse", checkClean, "--reset")
	if res.code != 0 || res.stdout != "left: []\n" {
		t.Fatalf("after --reset: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// The sandbox works on, with both languages.
	if res := runIn(t, root, "reuse", "echo ok", "--language", "shell"); res.stdout != "ok\n" {
		t.Fatalf("after the reset: %+v", res)
	}
	if res := flmbox(t, root, "run", "--image", reg.digestRef(), "--reset", "-c", "print(1)"); res.code != 125 || !strings.Contains(res.stderr, "--reset takes --sandbox") {
		t.Fatalf("--reset with --image: %+v", res)
	}
}

// TestResetSocketDirectorySealed checks that a snippet cannot replace the
// agent's socket (to receive the next calls' code) nor trace the agent.
func TestResetSocketDirectorySealed(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "sealed")
	_, runDir, _ := faultAgentPaths(t, root, "sealed")
	code := fmt.Sprintf(`import os, socket
d = %q
for what, f in [('create', lambda: open(d + '/x', 'w')), ('rename', lambda: os.rename(d + '/agent.sock', d + '/y')),
                ('unlink', lambda: os.unlink(d + '/agent.sock')),
                ('bind', lambda: socket.socket(socket.AF_UNIX).bind(d + '/z')),
                ('read the agent memory', lambda: open('/proc/1/mem', 'rb').read(1)),
                ('read the agent environment', lambda: open('/proc/1/environ', 'rb').read())]:
    try:
        f()
        print(what, 'worked')
    except OSError as e:
        print(what, 'refused')
`, runDir)
	res := runIn(t, root, "sealed", code)
	if res.code != 0 || strings.Contains(res.stdout, "worked") || strings.Count(res.stdout, "refused") != 6 {
		t.Fatalf("exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := runIn(t, root, "sealed", "print('agent ok')"); res.stdout != "agent ok\n" {
		t.Fatalf("the agent after the attempts: %+v", res)
	}
}

// TestBatchSnippetsDoNotSeeEachOther runs a batch on one worker
// (--parallel 1), which reuses its sandbox: each snippet finds the sandbox
// as new, whatever the one before left.
func TestBatchSnippetsDoNotSeeEachOther(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	codes := []string{messCode, checkClean, messCode, checkClean,
		"import os\nos.kill(1, 9)", // the agent is not killable: the next snippet runs
		checkClean}
	in, _ := json.Marshal(map[string]any{"language": "python", "codes": codes})
	results := runBatch(t, root, in, len(codes), "--image", reg.digestRef(), "--parallel", "1")
	for i, r := range results {
		switch codes[i] {
		case messCode:
			if r.ExitCode != 0 || r.Stdout != "messy\n" {
				t.Errorf("result %d: %+v", i, r)
			}
		case checkClean:
			if r.ExitCode != 0 || r.Stdout != "left: []\n" {
				t.Errorf("result %d sees what an earlier snippet left: %+v", i, r)
			}
		}
	}
	if ls := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(ls) != "[]" {
		t.Errorf("sandboxes left after the batch: %s", ls)
	}
}
