//go:build integration

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// flmboxInDir runs flmbox with --root root (relative to dir) in the working
// directory dir.
func flmboxInDir(t *testing.T, dir, root string, args ...string) result {
	t.Helper()
	return runFlmboxIn(t, flmboxBin, dir, root, args...)
}

// TestRelativeRoot: --root relative/dir is the directory of that name under
// the working directory, for sandbox create (runsc failed with "cannot
// read client sync file ... EOF" when handed a relative rootfs), a warm
// call and run --image; doctor names the absolute root.
func TestRelativeRoot(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	dir := t.TempDir()
	const rel = "relative/dir"
	abs := filepath.Join(dir, rel)
	if err := os.MkdirAll(abs, 0o700); err != nil {
		t.Fatal(err)
	}
	copyPrewarmed(t, abs)
	cleanedRoot(t, abs)
	run := func(args ...string) string {
		t.Helper()
		res := flmboxInDir(t, dir, rel, args...)
		if res.code != 0 {
			t.Fatalf("flmbox --root %s %v (in %s): exit %d\nstdout: %s\nstderr: %s", rel, args, dir, res.code, res.stdout, res.stderr)
		}
		return res.stdout
	}
	if out := run("sandbox", "create", "--name", "rel", "--image", reg.digestRef()); out != "rel\n" {
		t.Fatalf("sandbox create printed %q", out)
	}
	if _, err := os.Stat(filepath.Join(stateroot.Sandbox(abs, "rel"), "sandbox.json")); err != nil {
		t.Fatalf("the sandbox is not under %s: %v", abs, err)
	}
	if out := run("run", "--sandbox", "rel", "-c", "import os; print(os.getcwd(), 6 * 7)"); !strings.HasSuffix(out, " 42\n") {
		t.Fatalf("a call in the sandbox printed %q", out)
	}
	if out := run("run", "--image", reg.digestRef(), "-l", "shell", "-c", "echo fresh"); out != "fresh\n" {
		t.Fatalf("run --image printed %q", out)
	}
	var checks []struct {
		Name   string `json:"name"`
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	}
	res := flmboxInDir(t, dir, rel, "doctor", "--json")
	if err := json.Unmarshal([]byte(res.stdout), &checks); err != nil {
		t.Fatalf("doctor --json printed %q (exit %d, stderr %q): %v", res.stdout, res.code, res.stderr, err)
	}
	found := false
	for _, c := range checks {
		if c.Name == "space" {
			found = true
			if !strings.HasSuffix(c.Detail, " "+abs) {
				t.Errorf("doctor's space check: %q, want it to name %s", c.Detail, abs)
			}
		}
	}
	if !found {
		t.Errorf("doctor --json has no space check: %s", res.stdout)
	}
	if out := run("sandbox", "rm", "rel"); strings.TrimSpace(out) != "" && !strings.Contains(out, "rel") {
		t.Fatalf("sandbox rm printed %q", out)
	}
}

// TestJSONSaysWhyASnippetWasKilled: run --json's stderr ends with the line
// plain mode prints when flmbox kills a snippet, out of memory
// (oom_killed) or out of time (timed_out), as a batch element's does.
func TestJSONSaysWhyASnippetWasKilled(t *testing.T) {
	// Not parallel: the agent's memory watch must stop the snippet before the host's cgroup does.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "json-kill", "--memory", "256MiB")
	var j struct {
		ExitCode  int    `json:"exit_code"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		OOMKilled bool   `json:"oom_killed"`
		TimedOut  bool   `json:"timed_out"`
	}
	res := runIn(t, root, "json-kill", `
import sys
print('growing', flush=True)
print('on stderr', file=sys.stderr, flush=True)
chunks = []
while True:
    chunks.append(bytearray(16 << 20))
`, "--json", "--timeout", "2m")
	if err := json.Unmarshal([]byte(res.stdout), &j); err != nil {
		t.Fatalf("run --json printed %q (stderr %q): %v", res.stdout, res.stderr, err)
	}
	const oomNote = "flmbox: the snippet was killed: the sandbox was running out of memory (its processes and its files under /tmp count together; flmbox sandbox create --memory sets the limit)\n"
	if res.code != 137 || j.ExitCode != 137 || !j.OOMKilled || j.Stdout != "growing\n" || j.Stderr != "on stderr\n"+oomNote || res.stderr != "" {
		t.Fatalf("out of memory: exit %d, object %+v, stderr %q", res.code, j, res.stderr)
	}
	checkAlive(t, root, "json-kill")

	j.Stderr = ""
	res = runIn(t, root, "json-kill", "sleep 60", "--json", "-l", "shell", "--timeout", "1.5s")
	if err := json.Unmarshal([]byte(res.stdout), &j); err != nil {
		t.Fatalf("run --json printed %q (stderr %q): %v", res.stdout, res.stderr, err)
	}
	if res.code != 124 || !j.TimedOut || j.OOMKilled || j.Stderr != "flmbox: the snippet timed out after 1.5s and was killed\n" {
		t.Fatalf("timed out: exit %d, object %+v, stderr %q", res.code, j, res.stderr)
	}
}
