//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/snippet/wire"
	"golang.org/x/sys/unix"
)

// Faults and bad input: runaway code, isolation, one process per
// call, leaks over many calls, and sandbox names, all against the real runsc
// through the flmbox CLI.

// faultListProcs prints the processes of the sandbox other than the agent
// (PID 1), its zygote, its spares and the listing itself, one "PID cmdline"
// a line. The agent, its zygote and its Python spares run as root, snippets
// as 65534; a shell spare is sh -s, leader of its own process group in the
// agent's session (a snippet's process that escaped with setsid leads its
// own session).
const faultListProcs = `
import os
me = os.getpid()
for p in sorted(os.listdir('/proc')):
    if not p.isdigit() or int(p) in (1, me):
        continue
    try:
        cmd = open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\0', b' ').decode(errors='replace').strip()
        stat = open('/proc/%s/stat' % p).read()
        ppid, pgrp, sid = (int(x) for x in stat[stat.rindex(')') + 2:].split()[1:4])
        uid = [l.split()[1] for l in open('/proc/%s/status' % p) if l.startswith('Uid:')][0]
    except (OSError, IndexError):
        continue
    if uid == '0':
        continue
    if pgrp == int(p) and sid != int(p) and cmd == 'sh -s':
        continue
    print(p, cmd)
`

// faultNoSnippetProcesses waits (30 s at most) until the sandbox runs nothing
// but its agent, and fails the test with what is left otherwise.
func faultNoSnippetProcesses(t *testing.T, root, name string) {
	t.Helper()
	var left string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		res := runIn(t, root, name, faultListProcs)
		if res.code != 0 {
			t.Fatalf("list the sandbox's processes: exit %d %q", res.code, res.stderr)
		}
		if left = res.stdout; left == "" {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Fatalf("processes left in the sandbox after the call:\n%s", left)
}

// faultAgentPaths returns, from sandbox name's OCI spec, the agent binary
// and its socket directory as the sandbox sees them, and the host directory
// mounted there.
func faultAgentPaths(t *testing.T, root, name string) (bin, runDir, hostRunDir string) {
	t.Helper()
	var spec struct {
		Root    struct{ Path string }
		Process struct{ Args []string }
		Mounts  []struct{ Destination, Source string }
	}
	b, err := os.ReadFile(filepath.Join(stateroot.Sandbox(root, name), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil || len(spec.Process.Args) < 3 || spec.Process.Args[1] != "--socket" {
		t.Fatalf("config.json of %s: process %q: %v", name, spec.Process.Args, err)
	}
	runDir = filepath.Dir(spec.Process.Args[2])
	for _, m := range spec.Mounts {
		if m.Destination == runDir {
			hostRunDir = m.Source
		}
	}
	if hostRunDir == "" {
		t.Fatalf("config.json of %s mounts nothing on %s", name, runDir)
	}
	return spec.Process.Args[0], runDir, hostRunDir
}

// faultMaxRSS runs cmd and returns its peak resident memory. It uses
// /usr/bin/time when there is one: Go starts children with a vfork-like
// clone, and Linux charges the parent's peak to the child's ru_maxrss at
// exec, so ProcessState.SysUsage would report the test's own memory. Without
// /usr/bin/time it samples the child's VmHWM until it exits.
func faultMaxRSS(t *testing.T, cmd *exec.Cmd) (int64, error) {
	t.Helper()
	if _, err := os.Stat("/usr/bin/time"); err == nil {
		out := filepath.Join(t.TempDir(), "maxrss")
		cmd.Args = append([]string{"/usr/bin/time", "-f", "%M", "-o", out}, cmd.Args...)
		cmd.Path = "/usr/bin/time"
		err := cmd.Run()
		b, _ := os.ReadFile(out)
		kb, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && perr != nil {
			err = fmt.Errorf("/usr/bin/time wrote %q: %w", b, perr)
		}
		return kb << 10, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var hwm int64
	for {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
					if f := strings.Fields(v); len(f) == 2 {
						kb, _ := strconv.ParseInt(f[0], 10, 64)
						hwm = max(hwm, kb<<10)
					}
				}
			}
		}
		select {
		case err := <-done:
			return hwm, err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// faultDirBytes is the disk usage of the regular files under dir.
func faultDirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Sys().(*syscall.Stat_t).Blocks * 512
			}
		}
		return nil
	})
	return n
}

func TestFaultsRunawayCodeIsStopped(t *testing.T) {
	t.Parallel()
	root, _, name := runawaySandbox(t)

	t.Run("infinite loop", func(t *testing.T) {
		start := time.Now()
		res := runIn(t, root, name, "while True: pass", "--timeout", "2s")
		took := time.Since(start)
		if res.code != 124 || !strings.Contains(res.stderr, "timed out") {
			t.Fatalf("exit %d stderr %q, want 124 and a timeout message", res.code, res.stderr)
		}
		if took < 2*time.Second { // not a premature stop
			t.Errorf("a 2s timeout stopped the call after %s", took)
		}
		t.Logf("stopped after %s", took.Round(time.Millisecond))
		checkAlive(t, root, name)
		faultNoSnippetProcesses(t, root, name)
	})

	// A snippet that joins its parent's process group (the zygote's, the
	// agent's) is not reached by the group kill: it is killed by its pid.
	t.Run("infinite loop that left its process group", func(t *testing.T) {
		for range 2 { // the first Python call is a python3 of its own, the next a zygote's child
			res := runIn(t, root, name, "import os\nos.setpgid(0, os.getpgid(os.getppid()))\nwhile True: pass", "--timeout", "1s")
			if res.code != 124 || !strings.Contains(res.stderr, "timed out") {
				t.Fatalf("exit %d stderr %q, want 124 and a timeout message", res.code, res.stderr)
			}
			checkAlive(t, root, name)
			faultNoSnippetProcesses(t, root, name)
		}
	})

	t.Run("sleep left behind", func(t *testing.T) {
		// A call that waited for its background process would hit the
		// default timeout instead: exit 124.
		res := runIn(t, root, name, "sleep 1000 & echo started", "-l", "shell")
		if res.code != 0 || res.stdout != "started\n" {
			t.Fatalf("exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		checkAlive(t, root, name)
		faultNoSnippetProcesses(t, root, name) // no "sleep 1000"
	})

	// Out of the group kill's reach, they are killed once no call runs. The
	// calls wait until their daemons have left the group.
	t.Run("daemons left behind", func(t *testing.T) {
		res := runIn(t, root, name, `rm -f /tmp/d1 /tmp/d2
setsid sh -c 'touch /tmp/d1; exec sleep 1000' &
setsid sh -c 'touch /tmp/d2; while :; do :; done' &
until [ -e /tmp/d1 ] && [ -e /tmp/d2 ]; do sleep 0.01; done
echo started`, "-l", "shell")
		if res.code != 0 || res.stdout != "started\n" {
			t.Fatalf("exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		faultNoSnippetProcesses(t, root, name)
		for range 2 { // and again, with the spares the sweep left
			res = runIn(t, root, name, `import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, b'up')
        while True:
            time.sleep(0.01)
    os._exit(0)
print(os.read(r, 2).decode())`)
			if res.code != 0 || res.stdout != "up\n" {
				t.Fatalf("exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
			}
			faultNoSnippetProcesses(t, root, name)
		}
		// A child that a snippet gives the zygote, where its spares are
		// (clone with CLONE_PARENT): a stray all the same.
		res = runIn(t, root, name, `import ctypes, os, time
r, w = os.pipe()
if ctypes.CDLL(None).syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:
    os.setsid()
    os.write(w, b'%d' % os.getppid())
    while True:
        time.sleep(0.01)
print(os.read(r, 16).decode() == str(os.getppid()))`)
		if res.code != 0 || res.stdout != "True\n" {
			t.Fatalf("want the daemon to be the zygote's child: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		faultNoSnippetProcesses(t, root, name)
		checkAlive(t, root, name)
	})

	t.Run("fork bomb", func(t *testing.T) {
		// Children that stay alive: fork fails once the snippet's process
		// limit is reached, and the call ends. (They exec: a forked
		// Python costs some 5 MiB under gVisor, and 255 of them would
		// run out of memory first.)
		res := runIn(t, root, name, `
import os
n = 0
try:
    while True:
        if os.fork() == 0:
            os.execv('/bin/sleep', ['sleep', '1000'])
        n += 1
except OSError as e:
    print("fork failed after", n, type(e).__name__, e.errno)
`, "--timeout", "30s")
		if res.code != 0 || !strings.HasPrefix(res.stdout, "fork failed after ") || !strings.HasSuffix(res.stdout, fmt.Sprintf(" BlockingIOError %d\n", int(syscall.EAGAIN))) {
			t.Fatalf("python fork loop: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		t.Logf("python: %s", strings.TrimSpace(res.stdout))
		checkAlive(t, root, name)
		faultNoSnippetProcesses(t, root, name)

		// The classic shell bomb (dash spells it without ':'), kept running
		// until the timeout stops it all. The shell forks once, before the
		// bomb fills the process limit, then loops in builtins: a fork that
		// failed later would end it (dash exits 2 on "Cannot fork").
		start := time.Now()
		res = runIn(t, root, name, "b(){ b|b& }; b & while :; do :; done", "-l", "shell", "--timeout", "3s")
		if res.code != 124 || !strings.Contains(res.stderr, "timed out") {
			t.Fatalf("shell fork bomb: exit %d stderr %q, want 124 and a timeout message", res.code, res.stderr)
		}
		t.Logf("shell: exit %d after %s", res.code, time.Since(start).Round(time.Millisecond))
		checkAlive(t, root, name)
		faultNoSnippetProcesses(t, root, name)
	})

	t.Run("filling tmp", func(t *testing.T) {
		// Names of the test's own: the sandbox's /tmp must not be the
		// host's, where they would then appear.
		fill := fmt.Sprintf("flmbox-fill-%d-%d", os.Getpid(), time.Now().UnixNano())
		fill2 := fill + "-2"
		for _, f := range []string{fill, fill2} {
			if _, err := os.Lstat(filepath.Join("/tmp", f)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the host's /tmp/%s before the test: %v", f, err)
			}
		}
		sbDir := stateroot.Sandbox(root, name)
		before := faultDirBytes(t, sbDir)
		res := runIn(t, root, name, fmt.Sprintf("dd if=/dev/zero of=/tmp/%[1]s bs=1M 2>&1; stat -c %%s /tmp/%[1]s", fill), "-l", "shell")
		if !strings.Contains(res.stdout, "No space left on device") {
			t.Fatalf("dd: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		size, _ := strconv.ParseInt(lines[len(lines)-1], 10, 64)
		if size <= 0 || size > 64<<20 {
			t.Fatalf("/tmp/%s is %d bytes with --tmp-size 64MiB", fill, size)
		}
		res = runIn(t, root, name, fmt.Sprintf(`
import errno
try:
    with open('/tmp/%s', 'wb') as f:
        while True:
            f.write(b'x' * (1 << 20))
except OSError as e:
    print(errno.errorcode[e.errno])
`, fill2))
		if res.code != 0 || res.stdout != "ENOSPC\n" {
			t.Fatalf("python: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		checkAlive(t, root, name) // even with /tmp full
		for _, f := range []string{fill, fill2} {
			if _, err := os.Lstat(filepath.Join("/tmp", f)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the sandbox's /tmp/%s is on the host's /tmp: %v", f, err)
			}
		}
		if after := faultDirBytes(t, sbDir); after-before > 8<<20 {
			t.Errorf("the sandbox's host directory grew by %d bytes while /tmp filled", after-before)
		}
		res = runIn(t, root, name, fmt.Sprintf("rm /tmp/%s /tmp/%s && echo ok > /tmp/ok && cat /tmp/ok", fill, fill2), "-l", "shell")
		if res.code != 0 || res.stdout != "ok\n" {
			t.Fatalf("after rm: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		checkAlive(t, root, name)
	})

	// Four times what flmbox may hold: output it kept whole would show in
	// its max RSS.
	t.Run("flood of output", func(t *testing.T) {
		const total, maxRSS = 256 << 20, 64 << 20
		agentRSS := func() int64 {
			res := runIn(t, root, name, "grep VmRSS /proc/1/status", "-l", "shell")
			f := strings.Fields(res.stdout)
			if len(f) != 3 {
				t.Fatalf("agent's VmRSS: %q %q", res.stdout, res.stderr)
			}
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
		rssBefore := agentRSS()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, flmboxBin, "--root", root, "--runsc", runscPath, "run", "--sandbox", name,
			"-l", "shell", "--json", "--timeout", "4m", "-c", fmt.Sprintf("yes | head -c %d", total))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		rss, err := faultMaxRSS(t, cmd)
		if err != nil {
			t.Fatalf("flmbox run: %v\n%s", err, stderr.String())
		}
		took := time.Since(start)
		var j struct {
			ExitCode        int    `json:"exit_code"`
			Stdout          string `json:"stdout"`
			StdoutTail      string `json:"stdout_tail"`
			StdoutBytes     int64  `json:"stdout_bytes"`
			StdoutTruncated bool   `json:"stdout_truncated"`
			TimedOut        bool   `json:"timed_out"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &j); err != nil {
			t.Fatalf("--json printed %d bytes: %v", stdout.Len(), err)
		}
		if j.ExitCode != 0 || j.TimedOut || !j.StdoutTruncated || j.StdoutBytes != total {
			t.Errorf("exit %d timed_out %v stdout_truncated %v stdout_bytes %d", j.ExitCode, j.TimedOut, j.StdoutTruncated, j.StdoutBytes)
		}
		// stdout is an exact prefix, stdout_tail the end: no text of flmbox's.
		if len(j.Stdout) != wire.DefaultMaxOutput/2 || len(j.StdoutTail) != wire.DefaultMaxOutput/2 || strings.Trim(j.Stdout+j.StdoutTail, "y\n") != "" ||
			!strings.HasPrefix(j.Stdout, "y\ny\n") || !strings.HasSuffix(j.StdoutTail, "y\ny\n") {
			t.Errorf("stdout is %d bytes, stdout_tail %d (want %d each, only the snippet's bytes)", len(j.Stdout), len(j.StdoutTail), wire.DefaultMaxOutput/2)
		}
		if rss > maxRSS {
			t.Errorf("flmbox's max RSS was %d MiB while %d MiB of output went by", rss>>20, total>>20)
		}
		rssAfter := agentRSS()
		if rssAfter-rssBefore > 64<<20 {
			t.Errorf("the agent's RSS grew from %d to %d MiB", rssBefore>>20, rssAfter>>20)
		}
		t.Logf("%d MiB in %s; flmbox max RSS %d MiB; JSON %d bytes; agent RSS %d -> %d MiB",
			total>>20, took.Round(time.Millisecond), rss>>20, stdout.Len(), rssBefore>>20, rssAfter>>20)
		checkAlive(t, root, name)
	})
}

// runawaySandbox creates a sandbox for runaway code, with a /tmp of 64 MiB,
// in a root of its own.
func runawaySandbox(t *testing.T) (root string, reg *testRegistry, name string) {
	t.Helper()
	reg = startRegistry(t)
	root = sandboxRoot(t, reg)
	name = "runaway"
	createSandbox(t, root, reg, name, "--tmp-size", "64MiB")
	checkAlive(t, root, name)
	return root, reg, name
}

// TestFaultsMemoryHogsAreStopped: the agent's memory watch stops a snippet
// that grows past the sandbox's memory, alone or in several processes, and
// the sandbox and its /tmp live on.
func TestFaultsMemoryHogsAreStopped(t *testing.T) {
	// Not parallel: its memory hogs race the agent's memory watch, which other tests' load slows.
	root, reg, name := runawaySandbox(t)

	t.Run("memory hog", func(t *testing.T) {
		res := runIn(t, root, name, `
chunks = []
while True:
    chunks.append(bytearray(16 << 20))
`)
		if res.code != 137 || !strings.Contains(res.stderr, "running out of memory") {
			t.Fatalf("exit %d stderr %q, want 137 and the memory watch's note", res.code, res.stderr)
		}
		checkAlive(t, root, name)
		faultNoSnippetProcesses(t, root, name)
	})

	// Several processes, each well under the sandbox's memory, and files
	// in /tmp together over it: without the agent's memory watch the host's
	// memory cgroup killed the whole sandbox, /tmp and all.
	t.Run("memory hog with several processes and a full tmp", func(t *testing.T) {
		const small = "small-memory"
		createSandbox(t, root, reg, small, "--memory", "256MiB", "--tmp-size", "256MiB")
		defer flmbox(t, root, "sandbox", "rm", small)
		// Two processes of 80 MiB each that hold their memory once they
		// have it, so that both are at their
		// peak together however the machine schedules them (a child that
		// exited before the other grew left nothing to kill under load).
		// Only the memory watch ends them: without it, the timeout would.
		const grow = `
import os, time
for i in range(2):
    if os.fork() == 0:
        chunks = []
        while len(chunks) < 5:
            chunks.append(bytearray(16 << 20))
            for j in range(0, len(chunks[-1]), 4096):
                chunks[-1][j] = 1
        while True:
            time.sleep(1)
for i in range(2):
    os.wait()
`
		res := runIn(t, root, small, `
with open('/tmp/keep', 'wb') as f:
    for i in range(120):
        f.write(b'k' * (1 << 20))
print('wrote /tmp/keep', flush=True)
`+grow, "--timeout", "2m")
		if res.code != 137 || res.stdout != "wrote /tmp/keep\n" || !strings.Contains(res.stderr, "running out of memory") {
			t.Fatalf("exit %d stdout %q stderr %q, want 137 and the snippet killed out of memory", res.code, res.stdout, res.stderr)
		}
		res = runIn(t, root, small, "import os; print(os.path.getsize('/tmp/keep'))", "--json")
		var j struct {
			ExitCode  int    `json:"exit_code"`
			Stdout    string `json:"stdout"`
			OOMKilled bool   `json:"oom_killed"`
		}
		if err := json.Unmarshal([]byte(res.stdout), &j); err != nil || j.ExitCode != 0 || j.OOMKilled || j.Stdout != "125829120\n" {
			t.Fatalf("the sandbox or its /tmp did not survive: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		faultNoSnippetProcesses(t, root, small)

		// The same processes as a batch element, /tmp still full: the
		// element says why it was killed, and the next one runs.
		in, _ := json.Marshal(map[string]any{"codes": []string{grow, "print('next')"}})
		results := runBatch(t, root, in, 2, "--sandbox", small, "--parallel", "1")
		if r := results[0]; r.ExitCode != 137 || r.Stdout != "" || !strings.Contains(r.Stderr, "running out of memory") {
			t.Errorf("the element out of memory: %+v", r)
		}
		if r := results[1]; r.ExitCode != 0 || r.Stdout != "next\n" {
			t.Errorf("the next element: %+v", r)
		}
		checkAlive(t, root, small)
	})
}

func TestFaultsIsolation(t *testing.T) {
	// Not parallel: t.Setenv.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const secret = "flmbox-secret-7f3a9c"
	t.Setenv("FLMBOX_SECRET_TEST", secret) // flmbox's own environment, from create on
	const name = "iso"
	createSandbox(t, root, reg, name)

	t.Run("root filesystem is read-only", func(t *testing.T) {
		var spec struct{ Root struct{ Path string } }
		b, _ := os.ReadFile(filepath.Join(stateroot.Sandbox(root, name), "config.json"))
		if err := json.Unmarshal(b, &spec); err != nil || spec.Root.Path == "" {
			t.Fatalf("config.json: %v", err)
		}
		agentBin, _, _ := faultAgentPaths(t, root, name)
		binBefore, err := os.ReadFile(flmboxAgent)
		if err != nil {
			t.Fatal(err)
		}
		res := runIn(t, root, name, `
import errno
for p in ['/usr/x', '/var/tmp/x', '/x', '/etc/x', '/usr/bin/python3']:
    try:
        open(p, 'ab').write(b'x')
        print(p, 'WRITTEN')
    except OSError as e:
        print(p, errno.errorcode[e.errno])
`)
		if res.code != 0 {
			t.Fatalf("exit %d stderr %q", res.code, res.stderr)
		}
		for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
			if f := strings.Fields(line); len(f) != 2 || (f[1] != "EROFS" && f[1] != "EACCES") {
				t.Errorf("write %s", line)
			}
		}
		for _, p := range []string{"usr/x", "var/tmp/x", "x", "etc/x"} {
			if _, err := os.Lstat(filepath.Join(spec.Root.Path, p)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the host rootfs has %s: %v", p, err)
			}
		}
		// The agent's own binary, bind-mounted from the host: not writable
		// (gVisor may say ENOENT for a read-only file mount), and unchanged.
		res = runIn(t, root, name, fmt.Sprintf("open(%q, 'ab').write(b'x')", agentBin))
		if res.code == 0 {
			t.Errorf("a snippet appended to the agent's binary %s", agentBin)
		}
		if binAfter, _ := os.ReadFile(flmboxAgent); !bytes.Equal(binAfter, binBefore) {
			t.Errorf("the host's flmbox-agent binary changed")
		}
		res = runIn(t, root, name, "touch /usr/y", "-l", "shell")
		if res.code == 0 || !(strings.Contains(res.stderr, "Read-only file system") || strings.Contains(res.stderr, "Permission denied")) {
			t.Errorf("touch /usr/y: exit %d %q", res.code, res.stderr)
		}
	})

	t.Run("host files are out of reach", func(t *testing.T) {
		hostFile := filepath.Join(t.TempDir(), "secret.txt")
		if err := os.WriteFile(hostFile, []byte(secret+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res := runIn(t, root, name, "cat "+hostFile, "-l", "shell")
		if res.code == 0 || strings.Contains(res.stdout+res.stderr, secret) {
			t.Errorf("cat %s: exit %d stdout %q stderr %q", hostFile, res.code, res.stdout, res.stderr)
		}
		res = runIn(t, root, name, fmt.Sprintf("print(open(%q).read())", hostFile))
		if res.code == 0 || strings.Contains(res.stdout+res.stderr, secret) {
			t.Errorf("python open: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
	})

	t.Run("flmbox's environment is invisible", func(t *testing.T) {
		res := runIn(t, root, name, "env; cat /proc/1/environ | tr '\\0' '\\n'", "-l", "shell")
		if res.code != 0 || !strings.Contains(res.stdout, "HOME=/tmp") {
			t.Fatalf("exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		if strings.Contains(res.stdout, "FLMBOX_SECRET_TEST") || strings.Contains(res.stdout, secret) {
			t.Errorf("the snippet sees flmbox's environment:\n%s", res.stdout)
		}
	})

	t.Run("unprivileged user without capabilities", func(t *testing.T) {
		res := runIn(t, root, name, "grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs):' /proc/self/status", "-l", "shell")
		st := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
			k, v, _ := strings.Cut(line, ":")
			st[k] = strings.Join(strings.Fields(v), " ")
		}
		want := map[string]string{"Uid": "65534 65534 65534 65534", "Gid": "65534 65534 65534 65534",
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapAmb": "0000000000000000", "NoNewPrivs": "1"}
		for k, v := range want {
			if st[k] != v {
				t.Errorf("%s: %q, want %q (stdout %q stderr %q)", k, st[k], v, res.stdout, res.stderr)
			}
		}
	})

	// The agent's socket directory is a host directory mounted into the
	// sandbox: the agent's user creates its socket there, then flmbox makes
	// it root's, read-only for the sandbox. A snippet must not write the
	// host's disk through it (it is also a 64 KiB tmpfs of its own on the
	// host), nor replace the socket: with its own, to receive the next calls'
	// code, or with a symlink, to make flmbox (root on the host) connect to
	// another socket. The next call must work.
	t.Run("agent socket directory", func(t *testing.T) {
		_, runDir, hostRunDir := faultAgentPaths(t, root, name)
		res := runIn(t, root, name, fmt.Sprintf("head -c 1048576 /dev/zero > %s/planted; echo $?", runDir), "-l", "shell")
		var fs unix.Statfs_t
		if err := unix.Statfs(hostRunDir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
			t.Errorf("the host side of the agent's directory %s is not a tmpfs of its own (%v)", hostRunDir, err)
		}
		if _, err := os.Lstat(filepath.Join(hostRunDir, "planted")); err == nil {
			t.Errorf("a snippet created a file in the host's %s (shell said %q)", hostRunDir, strings.TrimSpace(res.stdout))
		}

		dir, err := os.MkdirTemp("", "flmbox-faults-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		hostSock := filepath.Join(dir, "host.sock")
		ln, err := net.Listen("unix", hostSock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var reached atomic.Int64
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				reached.Add(1)
				conn.Close()
			}
		}()
		res = runIn(t, root, name, fmt.Sprintf("rm -f %[1]s/agent.sock && ln -s %[2]s %[1]s/agent.sock; echo $?", runDir, hostSock), "-l", "shell")
		if !strings.Contains(res.stderr, "Permission denied") || strings.TrimSpace(res.stdout) == "0" {
			t.Errorf("a snippet replaced the agent's socket: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
		}
		res = runIn(t, root, name, "print('alive')")
		// flmbox has exited; a connection it made to the host socket is
		// queued, if not yet counted. Connect after it: the listener accepts
		// in order, and closes this connection once it has counted it, so
		// by then it has counted flmbox's too.
		probe, err := net.Dial("unix", hostSock)
		if err != nil {
			t.Fatal(err)
		}
		defer probe.Close()
		if err := probe.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := probe.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("the host socket's listener did not close the test's own connection: %v", err)
		}
		if n := reached.Load() - 1; n != 0 {
			t.Errorf("a snippet redirected flmbox's next call to the host socket %s (%d connections; the call: exit %d %q)", hostSock, n, res.code, res.stderr)
		}
		if res.code != 0 || res.stdout != "alive\n" {
			t.Errorf("after a snippet tried to replace the agent's socket, the next call: exit %d %q %q", res.code, res.stdout, res.stderr)
		}
	})
}

func TestFaultsEachCallIsANewProcess(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "calls"
	createSandbox(t, root, reg, name)
	for _, step := range []struct {
		what, lang, code, stdout string
		code2                    int
	}{
		{"python variable set", "python", "x = 41; print(x + 1)", "42\n", 0},
		{"python variable gone", "python", "print(x)", "", 1},
		{"shell export", "shell", "export FLMBOX_FAULTS=set; cd /usr; echo $FLMBOX_FAULTS", "set\n", 0},
		{"shell export gone, cwd back", "shell", "echo ${FLMBOX_FAULTS-unset} $(pwd)", "unset /tmp\n", 0},
		{"tmp file written", "shell", "echo kept > /tmp/kept.txt", "", 0},
		{"tmp file kept", "python", "print(open('/tmp/kept.txt').read(), end='')", "kept\n", 0},
	} {
		res := runIn(t, root, name, step.code, "-l", step.lang)
		if res.code != step.code2 || res.stdout != step.stdout {
			t.Errorf("%s: exit %d stdout %q stderr %q, want exit %d stdout %q", step.what, res.code, res.stdout, res.stderr, step.code2, step.stdout)
		}
		if step.what == "python variable gone" && !strings.Contains(res.stderr, "NameError") {
			t.Errorf("%s: stderr %q", step.what, res.stderr)
		}
	}
	pid := func() string { return runIn(t, root, name, "import os; print(os.getpid())").stdout }
	if a, b := pid(), pid(); a == b {
		t.Errorf("two calls ran in the same process %s", a)
	}
}

// faultCounts are what TestFaultsNoLeaks compares before and after.
type faultCounts struct {
	hostProcs, hostFDs     int
	sandboxProcs, agentFDs int
	agentRSS               int64
}

func TestFaultsNoLeaks(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "leaks"
	createSandbox(t, root, reg, name)
	id := sandboxID(t, root, name)
	_, _, hostRunDir := faultAgentPaths(t, root, name)
	socket := filepath.Join(hostRunDir, "agent.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	call := func(lang, code string) *wire.Result {
		t.Helper()
		res, err := wire.Call(ctx, socket, &wire.Request{Version: wire.ProtocolVersion, Language: lang, Code: code, TimeoutMS: 10000})
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		return res
	}
	calls := func(n int) {
		t.Helper()
		for i := range n {
			if res := call("shell", "echo ok"); res.ExitCode != 0 || string(res.Stdout.Data) != "ok\n" {
				t.Fatalf("call %d: exit %d stdout %q stderr %q error %q", i, res.ExitCode, res.Stdout.Data, res.Stderr.Data, res.Error)
			}
		}
	}
	count := func() faultCounts {
		t.Helper()
		var c faultCounts
		out, err := exec.Command("pgrep", "-f", id).Output()
		for _, pid := range strings.Fields(string(out)) {
			fds, err := os.ReadDir(filepath.Join("/proc", pid, "fd"))
			if err != nil {
				t.Fatalf("fds of runsc process %s: %v", pid, err)
			}
			c.hostProcs++
			c.hostFDs += len(fds)
		}
		res := call("python", `
import os
procs = sum(1 for p in os.listdir('/proc') if p.isdigit())
rss = [l.split()[1] for l in open('/proc/1/status') if l.startswith('VmRSS:')][0]
print(procs, rss)
`)
		f := strings.Fields(string(res.Stdout.Data))
		if res.ExitCode != 0 || len(f) != 2 {
			t.Fatalf("count inside: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout.Data, res.Stderr.Data)
		}
		c.sandboxProcs, _ = strconv.Atoi(f[0])
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		c.agentRSS = kb << 10
		// The agent's descriptors are out of the snippets' reach (it is
		// root's and not dumpable): list them as root, with CAP_SYS_PTRACE.
		out, err = exec.Command(runscPath, "--root", stateroot.Runsc(root), "--network=none", "--host-uds=create",
			"exec", "--user", "0:0", "--cap", "CAP_SYS_PTRACE", id, "/bin/ls", "/proc/1/fd").CombinedOutput()
		if err != nil {
			t.Fatalf("list the agent's descriptors: %v\n%s", err, out)
		}
		c.agentFDs = len(strings.Fields(string(out)))
		return c
	}

	// Warm up, the counting call included: gVisor keeps host files that a
	// first Python run opened (its modules) open for its dentry cache.
	calls(50)
	count()
	before := count()
	start := time.Now()
	calls(1000)
	took := time.Since(start)
	after := count()
	t.Logf("1000 calls in %s (%.1f ms each); before %+v; after %+v", took.Round(time.Millisecond),
		float64(took.Microseconds())/1000/1000, before, after)
	if before.hostProcs == 0 || after.hostProcs != before.hostProcs {
		t.Errorf("host runsc processes: %d before, %d after", before.hostProcs, after.hostProcs)
	}
	if after.hostFDs > before.hostFDs+5 {
		t.Errorf("host runsc fds: %d before, %d after", before.hostFDs, after.hostFDs)
	}
	if after.sandboxProcs != before.sandboxProcs {
		t.Errorf("processes in the sandbox: %d before, %d after", before.sandboxProcs, after.sandboxProcs)
	}
	if after.agentFDs > before.agentFDs+5 {
		t.Errorf("agent fds: %d before, %d after", before.agentFDs, after.agentFDs)
	}
	if after.agentRSS > before.agentRSS+20<<20 {
		t.Errorf("agent RSS: %d MiB before, %d MiB after", before.agentRSS>>20, after.agentRSS>>20)
	}
}

func TestFaultsSandboxNames(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "taken")
	ls := func() string { // names and states: last_used moves with every call
		var sbs []struct{ Name, Image, State string }
		out := mustFlmbox(t, root, "sandbox", "ls", "--json")
		if err := json.Unmarshal([]byte(out), &sbs); err != nil {
			t.Fatalf("sandbox ls --json printed %q: %v", out, err)
		}
		return fmt.Sprint(sbs)
	}
	entries := func() []string {
		var names []string
		for _, d := range []string{root, stateroot.Sandboxes(root)} {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				names = append(names, filepath.Join(d, e.Name()))
			}
		}
		return names
	}
	lsBefore, entriesBefore := ls(), entries()

	for _, tc := range []struct{ name, message string }{
		{"../x", `sandbox name "../x": use 1 to 64 letters`},
		{"a/b", `sandbox name "a/b": use 1 to 64 letters`},
		{"taken", "sandbox \"taken\" already exists\nflmbox: choose another name or remove it (flmbox sandbox rm taken)"},
	} {
		res := flmbox(t, root, "sandbox", "create", "--name", tc.name, "--image", reg.digestRef())
		if res.code != 125 || res.stdout != "" || !strings.Contains(res.stderr, "flmbox: "+tc.message) {
			t.Errorf("create --name %s: exit %d stdout %q stderr %q", tc.name, res.code, res.stdout, res.stderr)
		}
	}
	if after := ls(); after != lsBefore {
		t.Errorf("sandbox ls changed:\nbefore %s\nafter  %s", lsBefore, after)
	}
	if after := entries(); strings.Join(after, "\n") != strings.Join(entriesBefore, "\n") {
		t.Errorf("the state root changed:\nbefore %v\nafter  %v", entriesBefore, after)
	}
	checkAlive(t, root, "taken")

	// The refused duplicate must leave the first sandbox's lease on its image:
	// the image is still in use and cannot be removed from under it.
	res := flmbox(t, root, "images", "rm", reg.digestRef())
	if res.code != 125 || !strings.Contains(res.stderr, "taken") {
		t.Errorf("images rm of the image of running sandbox taken, after a refused duplicate create: exit %d stdout %q stderr %q",
			res.code, res.stdout, res.stderr)
	}

	for _, missing := range []string{"never-was", "taken-not"} {
		if res := flmbox(t, root, "sandbox", "rm", missing); res.code != 0 {
			t.Errorf("sandbox rm %s: exit %d %q", missing, res.code, res.stderr)
		}
	}
	if after := ls(); after != lsBefore {
		t.Errorf("sandbox ls changed after rm of missing names:\nbefore %s\nafter  %s", lsBefore, after)
	}
}

// TestFaultsStartupCodeInTmpNeverRunsUnlimited: Python runs at startup a
// sitecustomize found on PYTHONPATH (/tmp/site-packages) and the .pth files
// of the user site under HOME=/tmp. A snippet that plants them and tries to
// kill its zygote must not get them run in the next zygote, which has no
// limits, nor in any process the agent starts before it is the snippet's:
// the .pth file runs in the snippets' own Pythons only, limited, as python3
// runs it, and sys.path stays python3's (TestPlantedUserSiteNeverRunsAsRoot
// checks the zygote, spares and resets as root).
func TestFaultsStartupCodeInTmpNeverRunsUnlimited(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "startup"
	createSandbox(t, root, reg, name)
	for i := 0; i < 2; i++ { // the second Python call starts the zygote
		checkAlive(t, root, name)
	}
	plant := `
import os, sys
payload = "import os, resource; open('/tmp/ran-%s-%d-%d' % (__name__, os.getpid(), resource.getrlimit(resource.RLIMIT_NPROC)[0]), 'w')\n"
user = '/tmp/.local/lib/python%d.%d/site-packages' % sys.version_info[:2]
os.makedirs(user)
os.makedirs('/tmp/site-packages', exist_ok=True)
open(user + '/planted.pth', 'w').write(payload)
open('/tmp/site-packages/sitecustomize.py', 'w').write(payload)
parent = open('/proc/%d/cmdline' % os.getppid()).read()
print('zygote' if '_flmbox_zygote' in parent else 'not a zygote child', flush=True)
os.kill(os.getppid(), 9)
`
	if res := runIn(t, root, name, plant); res.stdout != "zygote\n" {
		t.Fatalf("planting: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
	// The next calls start a new zygote; then the startup code may only run
	// where a snippet runs python3 itself, under the snippet's limits.
	for i := 0; i < 2; i++ {
		res := runIn(t, root, name, "import sys; print(sys.path)")
		want := "['', '/tmp/site-packages', '/usr/lib/python311.zip', '/usr/lib/python3.11', '/usr/lib/python3.11/lib-dynload', '/tmp/.local/lib/python3.11/site-packages', '/usr/local/lib/python3.11/dist-packages', '/usr/lib/python3/dist-packages']\n"
		if res.code != 0 || res.stdout != want {
			t.Fatalf("call %d after the zygote died: exit %d stdout %q stderr %q, want sys.path %q", i, res.code, res.stdout, res.stderr, want)
		}
	}
	res := runIn(t, root, name, "python3 -c pass; ls /tmp | grep '^ran-'", "-l", "shell")
	// ran-MODULE-PID-NPROC: only the snippets' own Pythons, all limited: the
	// .pth file (module site) in the two calls' and in the python3 of the
	// shell, the sitecustomize on PYTHONPATH in that python3 only.
	runs := map[string]int{}
	for _, l := range strings.Fields(res.stdout) {
		module, _, _ := strings.Cut(strings.TrimPrefix(l, "ran-"), "-")
		runs[module]++
		if strings.HasSuffix(l, "--1") {
			runs["unlimited"]++
		}
	}
	if len(runs) != 2 || runs["site"] != 3 || runs["sitecustomize"] != 1 {
		t.Fatalf("want the planted code run only by the snippets' Pythons, under their limits; /tmp has %q (stderr %q)", res.stdout, res.stderr)
	}
}
