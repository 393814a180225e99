//go:build integration

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/runtime"
)

// densitySandboxes is how many sandboxes TestManySandboxes holds at once:
// enough that calls, listings, probes and removals meet many at a time,
// each kind of spares among them; how many a worker holds is flmbox bench
// --density's figure.
const densitySandboxes = 24

// TestManySandboxes holds densitySandboxes idle sandboxes at once, every
// other one with lazy spares: every one answers a call (each call lands in
// the sandbox it names), sandbox ls lists every one running, and --probe
// finds every agent answering; removing them leaves nothing: no directory,
// runsc state, host process, cgroup, image lease or mount.
func TestManySandboxes(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	names := make([]string, densitySandboxes)
	ids := map[string]string{}
	for i := range names {
		names[i] = fmt.Sprintf("many-%03d", i)
		var flags []string
		if i%2 == 1 {
			flags = []string{"--lazy-spares"}
		}
		createSandbox(t, root, reg, names[i], flags...)
		ids[names[i]] = sandboxID(t, root, names[i])
	}
	// Each answers with its own hostname: its container ID's first 12
	// characters, as docker's.
	for i, name := range names {
		want := strings.TrimPrefix(ids[name], "flmbox-")[:12]
		lang := []string{"--language", "shell", "-c", "cat /etc/hostname"}
		if i%3 == 0 {
			lang = []string{"-c", "import socket; print(socket.gethostname())"}
		}
		if out := mustFlmbox(t, root, append([]string{"run", "--sandbox", name}, lang...)...); strings.TrimSpace(out) != want {
			t.Fatalf("run --sandbox %s printed %q, want its hostname %s", name, out, want)
		}
	}
	for _, probe := range [][]string{nil, {"--probe"}} {
		sbs := sandboxLs(t, root, probe...)
		listed := map[string]string{}
		for _, sb := range sbs {
			listed[sb.Name] = sb.State
		}
		for _, name := range names {
			if listed[name] != "running" {
				t.Errorf("sandbox ls %v: %s is %q, want running", probe, name, listed[name])
			}
		}
		if len(sbs) != len(names) {
			t.Errorf("sandbox ls %v lists %d sandboxes, want %d", probe, len(sbs), len(names))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, name := range names {
		mustFlmbox(t, root, "sandbox", "rm", name)
	}
	if out := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("sandbox ls after removing them all: %s", out)
	}
	if left, _ := os.ReadDir(stateroot.Sandboxes(root)); len(left) > 0 {
		t.Errorf("%d entries left in the sandboxes directory", len(left))
	}
	if left, _ := filepath.Glob(filepath.Join(stateroot.Runsc(root), "[^.]*")); len(left) > 0 {
		t.Errorf("left in runsc's state directory: %v", left)
	}
	if ls := leases(t, root); len(ls) != 0 {
		t.Errorf("image leases left: %+v", ls)
	}
	if mounts := flmboxMounts(t, root); len(mounts) > 0 {
		t.Errorf("mounts left under the root: %v", mounts)
	}
	for _, id := range ids {
		waitNoProcesses(t, id)
		noCgroups(t, id)
	}
}

// TestIdleSandboxDropsItsZygote: once no call came for 30 s, a sandbox's
// agent drops the zygote and the forked Python spares that calls started
// (gVisor copies up to 2 MiB around each page a forked child writes): the
// sandbox's memory cgroup falls by megabytes, polled without a call (a call
// would restart the wait), and the next Python call runs in a python3 of
// the agent's (its parent is the agent, pid 1), not in a zygote's child.
func TestIdleSandboxDropsItsZygote(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "idle")
	id := sandboxID(t, root, "idle")
	ppid := func() string {
		return strings.TrimSpace(mustFlmbox(t, root, "run", "--sandbox", "idle", "-c", "import os; print(os.getppid())"))
	}
	if p := ppid(); p != "1" {
		t.Fatalf("a new sandbox's first Python call ran in a child of %s, want the agent's python3 (1)", p)
	}
	if p := ppid(); p == "1" {
		t.Fatal("the second Python call did not run in a zygote's child")
	}
	inUse := func() int64 {
		m, err := runtime.ContainerMemory(id)
		if err != nil {
			t.Fatal(err)
		}
		return m.Charged - m.InactiveFile
	}
	// The next spare is forked after the call: the most the sandbox holds
	// in its first seconds is the figure to fall from.
	var peak int64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		peak = max(peak, inUse())
	}
	var now int64
	pollUntil(t, 3*time.Minute, "the idle sandbox's memory to fall by 3 MiB", func() bool {
		now = inUse()
		return now <= peak-3<<20
	})
	t.Logf("idle sandbox's memory: %d MiB after its calls, %d MiB once idle", peak>>20, now>>20)
	if p := ppid(); p != "1" {
		t.Fatalf("the first Python call after the drop ran in a child of %s, want the agent's python3 (1)", p)
	}
}
