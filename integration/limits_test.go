//go:build integration

package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox"
)

// Limits: what a sandbox's limits promise, and limits too small
// for a sandbox.

// Many small files in /tmp: their metadata is gVisor's own memory, which
// neither /tmp's size nor /proc/meminfo sees. 100,000 empty files got a
// 128 MiB sandbox killed by the host's memory cgroup, /tmp and all. Now the
// snippet is stopped by the memory watch, which counts each file's inode
// (oom_killed, 137; or ENOSPC, were the inodes bounded), and the sandbox and
// its /tmp live on, with the smallest --memory flmbox accepts, where the
// watch has the least room; a plain rm -rf then empties the directory, and
// the next such snippet is stopped the same way. The loop stops early: a
// million files would take minutes under gVisor.
func TestLimitsManySmallFilesStopTheSnippetOnly(t *testing.T) {
	// Not parallel: the agent's memory watch must stop the snippet before the host's cgroup does.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "files"
	createSandbox(t, root, reg, name, "--memory", fmt.Sprintf("%dMiB", sandbox.MinMemoryBytes>>20), "--tmp-size", "16MiB")
	if res := runIn(t, root, name, "open('/tmp/keep', 'w').write('kept')"); res.code != 0 {
		t.Fatalf("write /tmp/keep: exit %d stderr %q", res.code, res.stderr)
	}
	for round := range 2 {
		dir := fmt.Sprintf("/tmp/d%d", round)
		res := runIn(t, root, name, fmt.Sprintf(`import os
os.mkdir(%[1]q)
for i in range(1_000_000):
    open(f"%[1]s/f{i}", "w").close()
`, dir), "--timeout", "5m")
		enospc := res.code == 1 && strings.Contains(res.stderr, "No space left on device")
		oom := res.code == 137 && strings.Contains(res.stderr, "running out of memory")
		if !enospc && !oom {
			t.Fatalf("round %d: exit %d stdout %q stderr %q, want the snippet stopped: ENOSPC, or 137 out of memory",
				round, res.code, res.stdout, res.stderr)
		}
		// In the shell: os.listdir of the files would make Python
		// grow while memory is short, and the watch kill it.
		res = runIn(t, root, name, fmt.Sprintf("echo $(ls -f %[1]s | wc -l) $(cat /tmp/keep) && rm -rf %[1]s", dir),
			"-l", "shell", "--timeout", "5m")
		if res.code != 0 || !strings.HasSuffix(res.stdout, " kept\n") {
			t.Fatalf("round %d: the sandbox or its /tmp did not survive: exit %d stdout %q stderr %q", round, res.code, res.stdout, res.stderr)
		}
		t.Logf("round %d: stopped (ENOSPC: %v) after %s files", round, enospc, strings.Fields(res.stdout)[0])
		checkAlive(t, root, name)
	}
}

// Limits too small for any sandbox are refused before anything is made,
// in one line that names the minimum (--pids 4 failed inside runsc with
// 2 KB of goroutine traces); the minimum itself makes a working sandbox.
func TestLimitsTooSmallAreRefused(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	for _, flags := range [][]string{
		{"--pids", "4", "pids 4 is below the minimum of 64"},
		{"--pids", "16", "pids 16 is below the minimum of 64"},
		{"--memory", "128MiB", "memory 134217728 bytes is below the minimum of 268435456 (256 MiB)"},
		{"--cpus", "0.01", "cpus 0.01 is below the minimum of 0.1"},
		{"--tmp-size", "16", "/tmp size 16 bytes is below the minimum of 1048576 (1 MiB)"},
	} {
		want := flags[2]
		flags = flags[:2]
		res := flmbox(t, root, append([]string{"sandbox", "create", "--name", "small", "--image", reg.digestRef()}, flags...)...)
		msg := strings.TrimSuffix(res.stderr, "\n")
		if res.code != 125 || strings.Contains(msg, "\n") || !strings.Contains(msg, want) {
			t.Errorf("sandbox create %v: exit %d stderr %q, want 125 and one line saying %q", flags, res.code, res.stderr, want)
		}
		if _, err := os.Lstat(stateroot.Sandbox(root, "small")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sandbox create %v left its directory: %v", flags, err)
		}
		if ls := leases(t, root); len(ls) != 0 {
			t.Errorf("sandbox create %v left leases: %+v", flags, ls)
		}
		if _, err := os.Stat(stateroot.Runsc(root)); err == nil {
			out, err := exec.Command(runscPath, "--root", stateroot.Runsc(root), "list", "-quiet").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("sandbox create %v: runsc list: %q %v, want no container", flags, out, err)
			}
		}
	}
	const name = "smallest"
	createSandbox(t, root, reg, name, "--pids", fmt.Sprint(sandbox.MinPids), "--memory", fmt.Sprintf("%dMiB", sandbox.MinMemoryBytes>>20),
		"--cpus", fmt.Sprint(sandbox.MinCPUs), "--tmp-size", fmt.Sprintf("%d", sandbox.MinTmpBytes))
	checkAlive(t, root, name)
	if res := runIn(t, root, name, "echo ok", "-l", "shell"); res.code != 0 || res.stdout != "ok\n" {
		t.Fatalf("a shell call in the smallest sandbox: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
	// A fork bomb meets RLIMIT_NPROC, never the host's pids cgroup, which
	// would kill the whole sandbox.
	if res := runIn(t, root, name, "b(){ b|b& }; b & while :; do :; done", "-l", "shell", "--timeout", "3s"); res.code != 124 {
		t.Fatalf("a fork bomb in the smallest sandbox: exit %d, want 124 (timeout)\n%s", res.code, res.stderr)
	}
	checkAlive(t, root, name)
	if n := sandboxPidsMax(t, root, name); n != 0 {
		t.Fatalf("the smallest sandbox's pids cgroup refused %d tasks", n)
	}
}
