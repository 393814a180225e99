//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// densitySandboxes is how many sandboxes TestManySandboxes holds at once:
// the CI machine's share of the 500 a worker of this size holds (flmbox
// bench --density measures those).
const densitySandboxes = 100

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
		faultSandbox(t, root, reg, names[i], flags...)
		ids[names[i]] = faultSandboxID(t, root, names[i])
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
		var sbs []struct{ Name, State string }
		out := mustFlmbox(t, root, append([]string{"sandbox", "ls", "--json"}, probe...)...)
		if err := json.Unmarshal([]byte(out), &sbs); err != nil {
			t.Fatalf("sandbox ls --json %v printed %q: %v", probe, out, err)
		}
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
	if mounts := mountsUnder(t, root); len(mounts) > 0 {
		t.Errorf("mounts left under the root: %v", mounts)
	}
	for _, id := range ids {
		waitNoProcesses(t, id)
		noCgroups(t, id)
	}
}
