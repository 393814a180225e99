//go:build integration

package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/testrig/testprog"
)

// TestWarmCallsWithoutCore: flmbox makes warm calls itself, without
// flmbox-core, and prints what flmbox-core prints for them; any other command
// needs flmbox-core and says so when it is missing.
func TestWarmCallsWithoutCore(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "warm"
	createSandbox(t, root, reg, name)

	alone := filepath.Join(t.TempDir(), "flmbox")
	b, err := os.ReadFile(flmboxBin)
	if err != nil {
		t.Fatal(err)
	}
	testprog.Write(t, alone, b)
	run := func(bin string, args ...string) result {
		t.Helper()
		return runFlmbox(t, bin, root, args...)
	}
	codeFile := filepath.Join(t.TempDir(), "code.py")
	if err := os.WriteFile(codeFile, []byte("import sys\nprint('from a file', file=sys.stderr)\nsys.exit(4)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
	}{
		{"python", []string{"-c", "print('fast')"}, 0},
		{"shell exit status", []string{"-l", "shell", "-c", "echo out; echo err >&2; exit 3"}, 3},
		{"a file", []string{codeFile}, 4},
		{"json with bytes that are not UTF-8", []string{"--json", "-c", "import sys; sys.stdout.buffer.write(b'\\xff\\xfe ok')"}, 0},
		{"timeout", []string{"--timeout", "300ms", "-c", "import time; time.sleep(5)"}, 124},
		{"json timeout", []string{"--json", "--timeout=300ms", "-l", "shell", "-c", "sleep 5"}, 124},
		{"a traceback", []string{"-c", "1/0"}, 1},
		{"output cap in bytes", []string{"--json", "--max-output", "64", "-c", "print('x' * 1000)"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--sandbox", name}, tc.args...)
			fast, core := run(alone, args...), run(flmboxCore, args...)
			if fast.code != tc.wantCode || core.code != tc.wantCode {
				t.Fatalf("exit %d (flmbox alone), %d (flmbox-core), want %d\nflmbox stderr: %s\nflmbox-core stderr: %s",
					fast.code, core.code, tc.wantCode, fast.stderr, core.stderr)
			}
			if slices.Contains(tc.args, "--json") {
				var f, c map[string]any
				if err := json.Unmarshal([]byte(fast.stdout), &f); err != nil {
					t.Fatalf("flmbox --json: %v: %q", err, fast.stdout)
				}
				if err := json.Unmarshal([]byte(core.stdout), &c); err != nil {
					t.Fatalf("flmbox-core --json: %v: %q", err, core.stdout)
				}
				delete(f, "duration_ms")
				delete(c, "duration_ms")
				if fb, cb := mustJSON(t, f), mustJSON(t, c); fb != cb {
					t.Errorf("flmbox printed %s, flmbox-core %s", fb, cb)
				}
				return
			}
			if fast.stdout != core.stdout || fast.stderr != core.stderr {
				t.Errorf("flmbox printed %q %q, flmbox-core %q %q", fast.stdout, fast.stderr, core.stdout, core.stderr)
			}
		})
	}

	// A batch in the running sandbox is the flmbox command's too, printed as
	// flmbox-core prints it (its exit status is 0 whatever its snippets').
	batch := filepath.Join(t.TempDir(), "batch.json")
	if err := os.WriteFile(batch, []byte(`{"language": "python", "codes": ["print('one')", "import sys; print('two', file=sys.stderr); sys.exit(3)", "print('\\xff')"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--batch", batch, "--sandbox", name, "--parallel", "2"}
	fast, core := run(alone, args...), run(flmboxCore, args...)
	if fast.code != 0 || core.code != 0 {
		t.Fatalf("batch: exit %d (flmbox alone), %d (flmbox-core)\nflmbox stderr: %s\nflmbox-core stderr: %s", fast.code, core.code, fast.stderr, core.stderr)
	}
	var fb, cb []map[string]any
	if err := json.Unmarshal([]byte(fast.stdout), &fb); err != nil || len(fb) != 3 {
		t.Fatalf("flmbox batch: %v: %q", err, fast.stdout)
	}
	if err := json.Unmarshal([]byte(core.stdout), &cb); err != nil || len(cb) != 3 {
		t.Fatalf("flmbox-core batch: %v: %q", err, core.stdout)
	}
	for i := range fb {
		delete(fb[i], "duration_ms")
		delete(cb[i], "duration_ms")
	}
	if f, c := mustJSON(t, fb), mustJSON(t, cb); f != c {
		t.Errorf("batch: flmbox printed %s, flmbox-core %s", f, c)
	}
	if fb[0]["stdout"] != "one\n" || fb[1]["exit_code"] != float64(3) {
		t.Errorf("batch: flmbox printed %s", fast.stdout)
	}

	// Everything else is flmbox-core's: without it, a clear failure.
	for _, args := range [][]string{{"sandbox", "ls"}, {"run", "--sandbox", "nosuch", "-c", "1"}} {
		res := run(alone, args...)
		if res.code != 125 || !strings.Contains(res.stderr, "flmbox-core") {
			t.Errorf("flmbox %v without flmbox-core: exit %d, stderr %q", args, res.code, res.stderr)
		}
	}
	// No environment variable changes what flmbox-core does with a call
	// (flmbox once handed a hung-up call over through one).
	env := exec.Command(flmboxCore, "--root", root, "--runsc", runscPath, "run", "--sandbox", name, "-l", "shell", "-c", "echo ran")
	env.Env = append(os.Environ(), "FLMBOX_INTERNAL_HUNG_UP=read the answer: the sandbox's agent hung up without an answer")
	if out, err := env.CombinedOutput(); err != nil || string(out) != "ran\n" {
		t.Errorf("flmbox-core with FLMBOX_INTERNAL_HUNG_UP set: %v %q", err, out)
	}
	// Code in a pipe is read once, by flmbox-core.
	piped := exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "run", "--sandbox", name, "-l", "shell", "/dev/stdin")
	piped.Stdin = strings.NewReader("echo piped")
	if out, err := piped.Output(); err != nil || string(out) != "piped\n" {
		t.Errorf("code from a pipe: %q, %v", out, err)
	}
	// With flmbox-core next to it, a call that cannot be made is explained.
	if res := run(flmboxBin, "run", "--sandbox", "nosuch", "-c", "1"); res.code != 125 || !strings.Contains(res.stderr, `no sandbox "nosuch"`) {
		t.Errorf("run on a missing sandbox: exit %d, stderr %q", res.code, res.stderr)
	}
}

// TestCoreOfAnotherBuild: flmbox hands a command line only to a
// flmbox-core of its own build; another build is named and refused (125).
func TestCoreOfAnotherBuild(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, bin := range []string{flmboxBin, flmboxAgent} {
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		testprog.Write(t, filepath.Join(dir, filepath.Base(bin)), b)
	}
	build := exec.Command("go", "build", "-tags", "urfave_cli_no_docs", "-ldflags",
		"-X github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd.Build=another", "-o", dir+"/", "../cmd/flmbox-core")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build flmbox-core: %v\n%s", err, out)
	}
	res := runFlmbox(t, filepath.Join(dir, "flmbox"), t.TempDir(), "sandbox", "ls")
	if res.code != 125 || !strings.Contains(res.stderr, "is not of the same build as this flmbox") || !strings.Contains(res.stderr, "Build=another") || res.stdout != "" {
		t.Fatalf("flmbox with a flmbox-core of another build: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	// The same flmbox with its own flmbox-core works.
	b, err := os.ReadFile(flmboxCore)
	if err != nil {
		t.Fatal(err)
	}
	testprog.Write(t, filepath.Join(dir, "flmbox-core"), b)
	if res := runFlmbox(t, filepath.Join(dir, "flmbox"), t.TempDir(), "sandbox", "ls"); res.code != 0 {
		t.Fatalf("flmbox with its own flmbox-core: exit %d, stderr %q", res.code, res.stderr)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
