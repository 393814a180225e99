//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox/record"
)

// ownerSnippet says it runs (a file the test looks for: flmbox run prints
// nothing before the snippet ends) and sleeps far past the test.
const ownerSnippet = `import pathlib, time; pathlib.Path("/tmp/up").touch(); print("up", flush=True); time.sleep(600)`

// killedOwner starts flmbox with args, which make a sandbox of their own
// (run --image, run --batch --image), waits until the snippet runs in it,
// SIGKILLs flmbox's process group, reaps it, and returns the sandbox's
// record as it was.
func killedOwner(t *testing.T, root string, args ...string) *record.Record {
	t.Helper()
	k := startKillable(t, exec.Command(flmboxBin, append([]string{"--root", root, "--runsc", runscPath}, args...)...))
	cmd, kill := k.cmd, k.kill

	var rec *record.Record
	pollUntil(t, 2*time.Minute, "the snippet to run in flmbox's sandbox", func() bool {
		k.mustRun(t, "flmbox")
		ents, _ := os.ReadDir(stateroot.Sandboxes(root))
		for _, e := range ents {
			if r, err := record.Read(root, e.Name()); err == nil && r.State == record.Running {
				rec = r
			}
		}
		return rec != nil && flmbox(t, root, "run", "--sandbox", rec.Name, "-l", "shell", "-c", "test -e /tmp/up").code == 0
	})
	if rec.Owner == nil || rec.Owner.PID != cmd.Process.Pid {
		kill()
		t.Fatalf("sandbox %s's owner is %+v, want flmbox's pid %d", rec.Name, rec.Owner, cmd.Process.Pid)
	}
	if sbs := sandboxLs(t, root); len(sbs) != 1 || sbs[0].Name != rec.Name || sbs[0].OwnerPID != cmd.Process.Pid {
		kill()
		t.Fatalf("sandbox ls while flmbox (pid %d) runs: %+v", cmd.Process.Pid, sbs)
	}
	kill()
	t.Logf("killed flmbox (pid %d) while its snippet ran in %s; %d host processes of %s remain",
		cmd.Process.Pid, rec.Name, runscProcesses(t, rec.ID), rec.ID)
	return rec
}

// TestOwnerKilled: the sandbox that flmbox run --image or run --batch
// --image made for itself goes with it. SIGKILLed while the snippet runs,
// flmbox cannot remove it: the next sandbox ls does, saying so, and leaves
// no sandbox, no runsc container and no image lease. (It once stayed
// running for ever, with its container and its lease.)
func TestOwnerKilled(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	image := reg.digestRef()
	batch := filepath.Join(t.TempDir(), "batch.json")
	in, _ := json.Marshal(map[string]any{"codes": []string{ownerSnippet}})
	if err := os.WriteFile(batch, in, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"run --image", []string{"run", "--image", image, "--timeout", "10m", "-c", ownerSnippet}},
		{"run --batch --image", []string{"run", "--batch", batch, "--image", image, "--timeout", "10m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := sandboxRoot(t, reg)
			ownerCleaned(t, root, killedOwner(t, root, tc.args...))
		})
	}
}

// ownerCleaned checks that the next sandbox ls removes sandbox rec, whose
// owner was killed, saying so, and that nothing of it is left.
func ownerCleaned(t *testing.T, root string, rec *record.Record) {
	t.Helper()
	res := flmbox(t, root, "sandbox", "ls", "--json")
	warning := fmt.Sprintf("removing sandbox %s, whose owner flmbox process %d is gone", rec.Name, rec.Owner.PID)
	if res.code != 0 || strings.TrimSpace(res.stdout) != "[]" || !strings.Contains(res.stderr, warning) {
		t.Fatalf("sandbox ls after flmbox was killed: exit %d\nstdout: %s\nstderr: %s\nwant [] and %q",
			res.code, res.stdout, res.stderr, warning)
	}
	if _, err := os.Lstat(rec.Dir); !os.IsNotExist(err) {
		t.Errorf("sandbox %s's directory is left: %v", rec.Name, err)
	}
	if ls := leases(t, root); len(ls) != 0 {
		t.Errorf("image leases left: %+v", ls)
	}
	if _, err := os.Stat(stateroot.Runsc(root)); err == nil {
		out, err := exec.Command(runscPath, "--root", stateroot.Runsc(root), "list", "-quiet").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("runsc list: %q %v, want no container", out, err)
		}
	}
	waitNoProcesses(t, rec.ID)
}
