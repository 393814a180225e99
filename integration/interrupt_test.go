//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// interruptedRun starts flmbox (bin) with args, a snippet that writes
// /tmp/started in sandbox probe once it has printed, waits until it has,
// sends sig, and returns what flmbox printed and its exit status. probe
// returns the name of the sandbox to look in (a run --image makes its own).
func interruptedRun(t *testing.T, bin, root string, sig syscall.Signal, probe func() string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--root", root, "--runsc", runscPath}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guard := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
	defer guard.Stop()
	pollUntil(t, time.Minute, "the snippet to start", func() bool {
		name := probe()
		return name != "" && flmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "test -e /tmp/started").code == 0
	})
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if ee != nil {
		res.code = ee.ExitCode()
	}
	return res
}

// interruptSnippet prints on both streams, says it started, and sleeps far
// past the test.
const interruptSnippet = "echo so far; echo err >&2; echo $$ > /tmp/pid; touch /tmp/started; sleep 1000"

// checkInterrupted checks what an interrupted flmbox run printed: the
// snippet's output so far and the signal's exit status, and with --json an
// object that says interrupted.
func checkInterrupted(t *testing.T, what string, res result, sig syscall.Signal, asJSON bool) {
	t.Helper()
	want := 128 + int(sig)
	if res.code != want {
		t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, res.code, want, res.stdout, res.stderr)
	}
	if !asJSON {
		if res.stdout != "so far\n" || res.stderr != "err\n" {
			t.Errorf("%s: stdout %q stderr %q, want the snippet's output so far", what, res.stdout, res.stderr)
		}
		return
	}
	var j struct {
		ExitCode    int    `json:"exit_code"`
		Stdout      string `json:"stdout"`
		Stderr      string `json:"stderr"`
		Interrupted bool   `json:"interrupted"`
		TimedOut    bool   `json:"timed_out"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &j); err != nil || !j.Interrupted || j.TimedOut || j.Stdout != "so far\n" || j.Stderr != "err\n" || j.ExitCode != 137 || res.stderr != "" {
		t.Errorf("%s: --json printed %q (%v), stderr %q", what, res.stdout, err, res.stderr)
	}
}

// TestRunInterrupted: Ctrl-C (SIGINT) or SIGTERM of flmbox run stops the
// snippet, prints what it printed so far (with --json, an object that says
// interrupted) and exits 130 or 143, by both fronts: the flmbox command's
// warm call and flmbox-core's run, on a sandbox and on a fresh one from
// --image, which is removed.
func TestRunInterrupted(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	mustFlmbox(t, root, "sandbox", "create", "--name", "work", "--image", reg.digestRef())
	work := func() string { return "work" }
	for _, tc := range []struct {
		bin  string
		sig  syscall.Signal
		json bool
	}{
		{flmboxBin, syscall.SIGINT, false},
		{flmboxBin, syscall.SIGTERM, true},
		{flmboxCore, syscall.SIGTERM, false},
		{flmboxCore, syscall.SIGINT, true},
	} {
		what := fmt.Sprintf("%s %s json=%v", tc.bin[strings.LastIndex(tc.bin, "/")+1:], tc.sig, tc.json)
		args := []string{"run", "--sandbox", "work", "--timeout", "10m", "-l", "shell", "-c", interruptSnippet}
		if tc.json {
			args = append(args, "--json")
		}
		mustFlmbox(t, root, "run", "--sandbox", "work", "-l", "shell", "-c", "rm -f /tmp/started /tmp/pid")
		res := interruptedRun(t, tc.bin, root, tc.sig, work, args...)
		checkInterrupted(t, what, res, tc.sig, tc.json)
		// The snippet was killed, not left to run out its timeout.
		pollUntil(t, time.Minute, what+": the snippet to be gone", func() bool {
			return flmbox(t, root, "run", "--sandbox", "work", "-l", "shell", "-c", `! kill -0 "$(cat /tmp/pid)" 2>/dev/null`).code == 0
		})
	}

	// run --batch: the array, with what the interrupted snippet printed.
	mustFlmbox(t, root, "run", "--sandbox", "work", "-l", "shell", "-c", "rm -f /tmp/started /tmp/pid")
	batch := filepath.Join(t.TempDir(), "batch.json")
	in, _ := json.Marshal(map[string]any{"codes": []string{interruptSnippet}})
	if err := os.WriteFile(batch, in, 0o600); err != nil {
		t.Fatal(err)
	}
	res := interruptedRun(t, flmboxBin, root, syscall.SIGINT, work, "run", "--batch", batch, "--sandbox", "work", "-l", "shell", "--timeout", "10m")
	var elems []struct {
		ExitCode    int    `json:"exit_code"`
		Stdout      string `json:"stdout"`
		Interrupted bool   `json:"interrupted"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &elems); err != nil || res.code != 130 || len(elems) != 1 || !elems[0].Interrupted || elems[0].Stdout != "so far\n" || elems[0].ExitCode != 137 {
		t.Errorf("run --batch: exit %d stdout %q stderr %q (%v)", res.code, res.stdout, res.stderr, err)
	}

	// run --image: the fresh sandbox is removed all the same.
	fresh := func() string {
		for _, sb := range sandboxLs(t, root) {
			if sb.Name != "work" {
				return sb.Name
			}
		}
		return ""
	}
	res = interruptedRun(t, flmboxBin, root, syscall.SIGINT, fresh, "run", "--image", reg.digestRef(), "--json", "-l", "shell", "-c", interruptSnippet)
	checkInterrupted(t, "run --image", res, syscall.SIGINT, true)
	if name := fresh(); name != "" {
		t.Errorf("run --image left sandbox %s", name)
	}
}
