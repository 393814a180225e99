//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox/record"
)

// The helpers that tests of every file use: running flmbox, a state root
// with the test image, a sandbox in it and calls to it, reading sandboxes'
// state, polling. Helpers of one family of tests live beside them.

// result is a finished flmbox process.
type result struct {
	stdout, stderr string
	code           int
}

// flmbox runs the flmbox binary with --root root.
func flmbox(t testing.TB, root string, args ...string) result {
	t.Helper()
	return runFlmbox(t, flmboxBin, root, args...)
}

// runFlmbox runs bin, a flmbox binary, with --root root and the tests' runsc.
func runFlmbox(t testing.TB, bin, root string, args ...string) result {
	t.Helper()
	return runFlmboxIn(t, bin, "", root, args...)
}

// runFlmboxIn is runFlmbox in the working directory dir ("": the test's).
func runFlmboxIn(t testing.TB, bin, dir, root string, args ...string) result {
	t.Helper()
	return startFlmboxIn(t, bin, dir, root, args...)()
}

// startFlmbox starts flmbox with --root root and returns a function that
// waits for it and returns what it did: a command that mostly waits runs
// beside the test's next steps. It is killed when the test ends unwaited.
func startFlmbox(t testing.TB, root string, args ...string) (wait func() result) {
	t.Helper()
	return startFlmboxIn(t, flmboxBin, "", root, args...)
}

// startFlmboxIn is startFlmbox of bin in the working directory dir; the
// command has 10 minutes.
func startFlmboxIn(t testing.TB, bin, dir, root string, args ...string) (wait func() result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	cmd := exec.CommandContext(ctx, bin, append([]string{"--root", root, "--runsc", runscPath}, args...)...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("run %s %v in %q: %v", bin, args, dir, err)
	}
	var once sync.Once
	var err error
	finish := func() {
		once.Do(func() {
			err = cmd.Wait()
			cancel()
		})
	}
	t.Cleanup(func() { cancel(); finish() })
	return func() result {
		t.Helper()
		finish()
		res, err := finished(&stdout, &stderr, err)
		if err != nil {
			t.Fatalf("run %s %v in %q: %v", bin, args, dir, err)
		}
		return res
	}
}

// finished is what a process whose Run or Wait returned err did: its
// output, and its exit code if it ran; err if it did not.
func finished(stdout, stderr *bytes.Buffer, err error) (result, error) {
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		res.code, err = ee.ExitCode(), nil
	}
	return res, err
}

// batchElement is one element of flmbox run --batch's output.
type batchElement struct {
	ExitCode     int      `json:"exit_code"`
	Stdout       string   `json:"stdout"`
	Stderr       string   `json:"stderr"`
	StdoutBase64 string   `json:"stdout_base64"`
	StderrBase64 string   `json:"stderr_base64"`
	TimedOut     *bool    `json:"timed_out"`
	OOMKilled    *bool    `json:"oom_killed"`
	DurationMS   *float64 `json:"duration_ms"`
}

// runBatch runs flmbox run --batch on input (JSON) with args, and returns
// its n elements; it fails the test unless flmbox printed n of them.
func runBatch(t testing.TB, root string, input []byte, n int, args ...string) []batchElement {
	t.Helper()
	batch := filepath.Join(t.TempDir(), "batch.json")
	if err := os.WriteFile(batch, input, 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustFlmbox(t, root, append([]string{"run", "--batch", batch}, args...)...)
	var results []batchElement
	if err := json.Unmarshal([]byte(out), &results); err != nil || len(results) != n {
		t.Fatalf("batch printed %q: %v", out, err)
	}
	return results
}

// mustFlmbox runs flmbox and fails the test unless it exits 0; it
// returns flmbox's stdout.
func mustFlmbox(t testing.TB, root string, args ...string) string {
	t.Helper()
	res := flmbox(t, root, args...)
	if res.code != 0 {
		t.Fatalf("flmbox %v: exit %d\nstdout: %s\nstderr: %s", args, res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// sandboxRoot returns a state root with the test image prewarmed from reg,
// and removes every sandbox in it (and runsc's mounts) when the test ends.
// Its cached tree is that of a root prewarmed once for all tests, mounted
// read-only (copyPrewarmed), and the prewarm from reg is a cache hit.
func sandboxRoot(t *testing.T, reg *testRegistry) string {
	t.Helper()
	return prewarmedSandboxRoot(t, reg, false)
}

// removableSandboxRoot is sandboxRoot for a test that removes the image
// (sandboxRoot's tree is read-only): linkPrewarmed.
func removableSandboxRoot(t *testing.T, reg *testRegistry) string {
	t.Helper()
	return prewarmedSandboxRoot(t, reg, true)
}

// prewarmedSandboxRoot is sandboxRoot, its tree linked (linkTrees) or
// mounted.
func prewarmedSandboxRoot(t *testing.T, reg *testRegistry, linkTrees bool) string {
	t.Helper()
	root := t.TempDir()
	fromPrewarmed(t, root, linkTrees)
	if res := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef()); !res.Cached {
		t.Fatalf("the copy of the prewarmed root is not a cache hit: %+v", res)
	}
	return cleanedRoot(t, root)
}

// unpackedSandboxRoot is sandboxRoot where the prewarm unpacks a tree of
// the root's own, for a test that looks at what a prewarm makes.
func unpackedSandboxRoot(t *testing.T, reg *testRegistry) string {
	t.Helper()
	root := t.TempDir()
	prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())
	return cleanedRoot(t, root)
}

// cleanedRoot removes every sandbox in root (and runsc's mounts) when the
// test ends, and returns root.
func cleanedRoot(t *testing.T, root string) string {
	t.Helper()
	t.Cleanup(func() {
		out := flmbox(t, root, "sandbox", "ls", "--json")
		var sbs []struct{ Name string }
		json.Unmarshal([]byte(out.stdout), &sbs)
		for _, sb := range sbs {
			flmbox(t, root, "sandbox", "rm", sb.Name)
		}
		// Exactly one mount: two would mean flmbox leaked one.
		if err := unix.Unmount(filepath.Join(stateroot.Runsc(root), "null-netns"), unix.MNT_DETACH); err == nil {
			if unix.Unmount(filepath.Join(stateroot.Runsc(root), "null-netns"), unix.MNT_DETACH) == nil {
				t.Error("runsc's null-netns was mounted twice")
			}
		}
	})
	return root
}

// faultSandbox creates a persistent sandbox called name in root from the test
// image, with extra create flags.
func createSandbox(t *testing.T, root string, reg *testRegistry, name string, flags ...string) {
	t.Helper()
	args := append([]string{"sandbox", "create", "--name", name, "--image", reg.digestRef()}, flags...)
	if got := strings.TrimSpace(mustFlmbox(t, root, args...)); got != name {
		t.Fatalf("sandbox create printed %q, want %q", got, name)
	}
}

// faultRun runs code in sandbox name: flmbox run --sandbox name ARGS... -c code.
func runIn(t *testing.T, root, name, code string, args ...string) result {
	t.Helper()
	return flmbox(t, root, append(append([]string{"run", "--sandbox", name}, args...), "-c", code)...)
}

// faultAlive fails the test unless the sandbox still answers a Python call.
func checkAlive(t *testing.T, root, name string) {
	t.Helper()
	if res := runIn(t, root, name, "print('alive')"); res.code != 0 || res.stdout != "alive\n" {
		t.Fatalf("the sandbox no longer answers: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
}

// pollUntil checks cond every 50 ms until it holds, and fails the test
// with what if it does not within d.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
	}
}

// sandboxEntry is a sandbox as sandbox ls --json lists it.
type sandboxEntry struct {
	Name       string    `json:"name"`
	State      string    `json:"state"`
	ID         string    `json:"id"`
	Shape      string    `json:"shape"`
	OwnerPID   int       `json:"owner_pid"`
	LastUsed   time.Time `json:"last_used"`
	ImageBytes int64     `json:"image_bytes"`
}

// sandboxLs runs sandbox ls --json ARGS... (which reconciles; with
// --probe, asks each agent) and returns what it lists; what it says on
// stderr (a repair) is logged. It is how the tests read sandboxes' state.
func sandboxLs(t testing.TB, root string, args ...string) []sandboxEntry {
	t.Helper()
	res := flmbox(t, root, append([]string{"sandbox", "ls", "--json"}, args...)...)
	if res.code != 0 {
		t.Fatalf("sandbox ls --json %v: exit %d\nstdout: %s\nstderr: %s", args, res.code, res.stdout, res.stderr)
	}
	if res.stderr != "" {
		t.Logf("sandbox ls --json %v said: %s", args, strings.TrimSpace(res.stderr))
	}
	var sbs []sandboxEntry
	if err := json.Unmarshal([]byte(res.stdout), &sbs); err != nil {
		t.Fatalf("sandbox ls --json %v printed %q: %v", args, res.stdout, err)
	}
	return sbs
}

// sandboxInfo is sandbox name as sandboxLs lists it, nil if it does not.
func sandboxInfo(t testing.TB, root, name string, args ...string) *sandboxEntry {
	t.Helper()
	for _, sb := range sandboxLs(t, root, args...) {
		if sb.Name == name {
			return &sb
		}
	}
	return nil
}

// sandboxState is sandbox name's state as sandboxLs lists it, "" if it
// does not list it.
func sandboxState(t testing.TB, root, name string, args ...string) string {
	t.Helper()
	if sb := sandboxInfo(t, root, name, args...); sb != nil {
		return sb.State
	}
	return ""
}

// sandboxNames are the sandboxes sandbox ls --json lists, with their states.
func sandboxNames(t *testing.T, root string) map[string]string {
	t.Helper()
	names := map[string]string{}
	for _, sb := range sandboxLs(t, root) {
		names[sb.Name] = sb.State
	}
	return names
}

// sandboxID is the runsc container ID of sandbox name, from its record:
// reading it reconciles nothing and asks no runsc.
func sandboxID(t testing.TB, root, name string) string {
	t.Helper()
	rec, err := record.ReadDir(stateroot.Sandbox(root, name))
	if err != nil || rec.ID == "" {
		t.Fatalf("the record of sandbox %s: %+v, %v", name, rec, err)
	}
	return rec.ID
}

// waitState waits up to a minute for sandbox ls --probe to list sandbox
// name in state want.
func waitState(t testing.TB, root, name, want string) {
	t.Helper()
	var got string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if got = sandboxState(t, root, name, "--probe"); got == want || time.Now().After(deadline) {
			break
		}
	}
	if got != want {
		t.Fatalf("sandbox ls --probe says %q, want %s", got, want)
	}
}
