//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// gcLine is a line of sandbox gc --json.
type gcLine struct {
	Name        string `json:"name"`
	Action      string `json:"action"`
	Reason      string `json:"reason"`
	MemoryBytes int64  `json:"memory_bytes"`
	DryRun      bool   `json:"dry_run"`
}

// gcJSON runs sandbox gc --json with args and returns its lines.
func gcJSON(t *testing.T, root string, args ...string) []gcLine {
	t.Helper()
	out := mustFlmbox(t, root, append([]string{"sandbox", "gc", "--json"}, args...)...)
	var lines []gcLine
	if err := json.Unmarshal([]byte(out), &lines); err != nil {
		t.Fatalf("sandbox gc --json %v printed %q: %v", args, out, err)
	}
	return lines
}

// gcLongCall starts a shell call in sandbox name that runs until the file
// /tmp/go appears in it (at most a minute), and waits until it runs; wait
// returns its output once it has ended.
func gcLongCall(t *testing.T, root, name string) (wait func() (string, error)) {
	t.Helper()
	cmd := exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "run", "--sandbox", name, "-l", "shell", "-c",
		"touch /tmp/started; i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; rm -f /tmp/started /tmp/go; echo done")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	pollUntil(t, time.Minute, "the long call in "+name+" to start", func() bool {
		return runIn(t, root, name, "test -e /tmp/started", "-l", "shell").code == 0
	})
	return func() (string, error) {
		if res := runIn(t, root, name, "touch /tmp/go", "-l", "shell"); res.code != 0 {
			t.Fatalf("end the long call in %s: exit %d %q", name, res.code, res.stderr)
		}
		select {
		case err := <-done:
			done <- err // for the cleanup
			return out.String(), err
		case <-time.After(time.Minute):
			t.Fatalf("the long call in %s did not end", name)
			return "", nil
		}
	}
}

// TestSandboxGCBudget: sandbox gc --max-running and --max-memory suspend the
// least recently used sandboxes until the budget is met, never one in a call
// (skipped, said when the budget is then not met, which fails gc); --dry-run
// says what it would do and changes nothing; a bad value changes nothing.
func TestSandboxGCBudget(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	names := []string{"a", "b", "c", "d"}
	for _, n := range names {
		createSandbox(t, root, reg, n, "--lazy-spares")
	}
	// use calls the sandboxes in order: the first is then the least
	// recently used.
	use := func(ns ...string) {
		t.Helper()
		for _, n := range ns {
			if res := runIn(t, root, n, "true", "-l", "shell"); res.code != 0 {
				t.Fatalf("call %s: exit %d %q", n, res.code, res.stderr)
			}
		}
	}
	states := func() string {
		t.Helper()
		s := sandboxNames(t, root)
		var out []string
		for _, n := range names {
			out = append(out, n+"="+s[n])
		}
		return strings.Join(out, " ")
	}
	const allRunning = "a=running b=running c=running d=running"
	use(names...)

	// Bad values: one line, nothing changed.
	for _, args := range [][]string{{"--max-running", "-1"}, {"--max-memory", "lots"}, {"--max-memory", "-5MiB"}} {
		res := flmbox(t, root, append([]string{"sandbox", "gc"}, args...)...)
		if res.code != 125 || res.stdout != "" || strings.Count(strings.TrimSpace(res.stderr), "\n") > 1 || !strings.Contains(res.stderr, "invalid argument") {
			t.Errorf("sandbox gc %v: exit %d\nstdout: %s\nstderr: %s", args, res.code, res.stdout, res.stderr)
		}
	}
	if got := states(); got != allRunning {
		t.Fatalf("after bad values: %s", got)
	}

	// --dry-run: the two least recently used, and nothing changes.
	out := mustFlmbox(t, root, "sandbox", "gc", "--dry-run", "--max-running", "2")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "would suspend a (idle ") || !strings.HasPrefix(lines[1], "would suspend b (idle ") ||
		!strings.HasSuffix(lines[0], "): over --max-running") {
		t.Fatalf("gc --dry-run --max-running 2 printed %q", out)
	}
	// --remove-idle goes oldest first.
	time.Sleep(1100 * time.Millisecond)
	out = mustFlmbox(t, root, "sandbox", "gc", "-n", "--remove-idle", "1s")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "would remove a ") || !strings.HasPrefix(lines[3], "would remove d ") {
		t.Fatalf("gc --dry-run --remove-idle 1s printed %q", out)
	}
	if got := states(); got != allRunning {
		t.Fatalf("after gc --dry-run: %s", got)
	}

	// a is the least recently used, and in a call: b and c go instead.
	wait := gcLongCall(t, root, "a")
	use("b", "c", "d")
	out = mustFlmbox(t, root, "sandbox", "gc", "--max-running", "2")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "suspend b (idle ") || !strings.HasPrefix(lines[1], "suspend c (idle ") {
		t.Fatalf("gc --max-running 2 with a in a call printed %q", out)
	}
	if got := states(); got != "a=running b=suspended c=suspended d=running" {
		t.Fatalf("after gc --max-running 2: %s", got)
	}
	// A budget that cannot be met: d goes, a is skipped, and gc says so.
	res := flmbox(t, root, "sandbox", "gc", "--max-running", "0")
	if res.code != 125 || !strings.Contains(res.stdout, "suspend d (idle ") || !strings.Contains(res.stdout, "skip a (idle ") ||
		!strings.Contains(res.stdout, "): in a call") || !strings.Contains(res.stderr, "the budget is not met: 1 sandbox runs (at most 0 wanted)") ||
		!strings.Contains(res.stderr, "1 in a call (a)") {
		t.Fatalf("gc --max-running 0 with a in a call: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	if got := states(); got != "a=running b=suspended c=suspended d=suspended" {
		t.Fatalf("after gc --max-running 0: %s", got)
	}
	if out, err := wait(); err != nil || out != "done\n" {
		t.Fatalf("the long call in a: %v, %q", err, out)
	}

	// --max-memory: resumed (a call resumes), each holds some MiB; a budget
	// of the two most recently used and half the smallest suspends the two
	// least recently used.
	use("a", "b", "c", "d")
	if got := states(); got != allRunning {
		t.Fatalf("after resuming them: %s", got)
	}
	mem := map[string]int64{}
	for _, l := range gcJSON(t, root, "--dry-run", "--max-memory", "0") {
		if l.Action != "suspend" || l.Reason != "max-memory" || !l.DryRun || l.MemoryBytes < 1<<20 || l.MemoryBytes > 512<<20 {
			t.Fatalf("gc --dry-run --max-memory 0: %+v", l)
		}
		mem[l.Name] = l.MemoryBytes
	}
	if len(mem) != 4 {
		t.Fatalf("gc --dry-run --max-memory 0 would suspend %v, want all four", mem)
	}
	t.Logf("host memory of the sandboxes: %v", mem)
	budget := mem["c"] + mem["d"] + min(mem["a"], mem["b"], mem["c"], mem["d"])/2
	lines := gcJSON(t, root, "--max-memory", fmt.Sprint(budget))
	if len(lines) != 2 || lines[0].Name != "a" || lines[1].Name != "b" || lines[0].Reason != "max-memory" || lines[0].DryRun {
		t.Fatalf("gc --max-memory %d (%v) did %+v", budget, mem, lines)
	}
	if got := states(); got != "a=suspended b=suspended c=running d=running" {
		t.Fatalf("after gc --max-memory: %s", got)
	}
	// Met already: nothing to do.
	if out := mustFlmbox(t, root, "sandbox", "gc", "--max-memory", fmt.Sprint(budget), "--max-running", "2"); out != "" {
		t.Fatalf("gc within its budget printed %q", out)
	}

	// A pooled sandbox counts, and is never suspended.
	mustFlmbox(t, root, "pool", "fill", reg.digestRef(), "--lazy-spares", "--size", "1")
	res = flmbox(t, root, "sandbox", "gc", "--max-running", "0")
	if res.code != 125 || !strings.Contains(res.stdout, "suspend c (idle ") || !strings.Contains(res.stdout, "suspend d (idle ") ||
		strings.Contains(res.stdout, "pool-") || !strings.Contains(res.stderr, "1 sandbox runs (at most 0 wanted)") ||
		!strings.Contains(res.stderr, "1 pooled") {
		t.Fatalf("gc --max-running 0 with a pooled sandbox: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	pooled := 0
	for name, st := range sandboxNames(t, root) {
		if strings.HasPrefix(name, "pool-") && st == "pooled" {
			pooled++
		}
	}
	if got := states(); got != "a=suspended b=suspended c=suspended d=suspended" || pooled != 1 {
		t.Fatalf("after gc --max-running 0 with a pool: %s, %d pooled", got, pooled)
	}
	mustFlmbox(t, root, "pool", "drain")
}

// TestSandboxGCLeavesACallAlone: sandbox gc --remove-idle and --suspend-idle
// count idle time from a call's start, but never take a sandbox whose call
// still runs (its lock says so, in any process), --dry-run included; an
// idle one beside it goes.
func TestSandboxGCLeavesACallAlone(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "busy", "--lazy-spares")
	createSandbox(t, root, reg, "idle", "--lazy-spares")
	wait := gcLongCall(t, root, "busy")
	time.Sleep(1500 * time.Millisecond) // both idle for longer than 1s by their last call's start
	for _, args := range [][]string{{"--dry-run", "--remove-idle", "1s"}, {"--suspend-idle", "1s"}, {"--remove-idle", "1s"}} {
		lines := gcJSON(t, root, args...)
		for _, l := range lines {
			if l.Name == "busy" {
				t.Fatalf("sandbox gc %v took the sandbox in a call: %+v", args, lines)
			}
		}
		if len(lines) != 1 || lines[0].Name != "idle" {
			t.Fatalf("sandbox gc %v: %+v, want the idle sandbox alone", args, lines)
		}
	}
	if out, err := wait(); err != nil || !strings.Contains(out, "done") {
		t.Fatalf("the long call: %v %q", err, out)
	}
	if names := sandboxNames(t, root); names["busy"] != "running" || names["idle"] != "" {
		t.Fatalf("after gc: %v, want busy running and idle removed", names)
	}
}
