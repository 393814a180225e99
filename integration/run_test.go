//go:build integration

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox/record"
)

// rootfsListing lists the top of the cached rootfs of the test image and
// the root directory's mtime: sandboxes must never change the shared tree.
func rootfsListing(t *testing.T, root string) string {
	t.Helper()
	dir := filepath.Join(stateroot.Images(root), "rootfs", strings.TrimPrefix(img.AMD64Digest.String(), "sha256:"), "rootfs")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return fmt.Sprint(names, fi.ModTime())
}

func TestDemo1PersistentSandbox(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	before := rootfsListing(t, root)
	defer func() {
		if after := rootfsListing(t, root); after != before {
			t.Errorf("the shared rootfs changed while sandboxes ran on it:\nbefore %s\nafter  %s", before, after)
		}
	}()
	if name := strings.TrimSpace(mustFlmbox(t, root, "sandbox", "create", "--name", "demo", "--image", reg.digestRef())); name != "demo" {
		t.Fatalf("sandbox create printed %q", name)
	}
	mustFlmbox(t, root, "run", "--sandbox", "demo", "--language", "shell", "-c",
		`mkdir -p /tmp/demo && printf 'region,revenue,cost\neast,120,75\nwest,80,55\neast,150,90\nwest,100,70\n' > /tmp/demo/sales.csv`)
	// The same program make demo runs, given as a FILE.
	out := mustFlmbox(t, root, "run", "--sandbox", "demo", "../demo/demo1.py")
	if out != "{\"rows\": 4, \"revenue\": 450, \"profit\": 160}\nLinux\n" {
		t.Fatalf("python call printed %q", out)
	}
	if out := mustFlmbox(t, root, "run", "--sandbox", "demo", "-l", "shell", "-c", "cat /tmp/demo/summary.json"); out != `{"rows": 4, "revenue": 450, "profit": 160}` {
		t.Fatalf("shell cat printed %q", out)
	}
	// Python variables do not persist between calls; files do.
	res := flmbox(t, root, "run", "--sandbox", "demo", "-c", "print(summary)")
	if res.code != 1 || !strings.Contains(res.stderr, "NameError") {
		t.Fatalf("a variable survived the call: exit %d %q", res.code, res.stderr)
	}
}

func TestDemo2Batch(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	var codes []string
	for _, d := range []string{"0.0", "0.1", "0.2", "1.2"} {
		codes = append(codes, fmt.Sprintf(`
discount = %s
if not 0 <= discount <= 1:
    raise ValueError("discount must be between 0 and 1")
revenue = round(450 * (1 - discount), 2)
print(revenue, round(revenue - 290, 2))
`, d))
	}
	in, _ := json.Marshal(map[string]any{"language": "python", "timeout": 30, "codes": codes})
	results := runBatch(t, root, in, 4, "--image", reg.digestRef())
	want := []string{"450.0 160.0\n", "405.0 115.0\n", "360.0 70.0\n", ""}
	for i, r := range results {
		if r.Stdout != want[i] || (r.ExitCode == 0) != (i < 3) {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if results[3].ExitCode != 1 || !strings.Contains(results[3].Stderr, "ValueError: discount must be between 0 and 1") {
		t.Errorf("fourth result: %+v", results[3])
	}
	// Fresh sandboxes were removed, and released the image.
	if ls := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(ls) != "[]" {
		t.Errorf("sandboxes left after the batch: %s", ls)
	}
}

func TestRunBadBatchesAreRefusedBeforeRunning(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	dir := t.TempDir()
	for _, tc := range []struct{ name, body, reason string }{
		{"empty", `{"codes": []}`, "a batch holds 1 to 64 codes, this one 0"},
		{"too many", `{"codes": [` + strings.Repeat(`"print(1)",`, 64) + `"print(1)"]}`, "a batch holds 1 to 64 codes, this one 65"},
		{"language", `{"language": "ruby", "codes": ["puts 1"]}`, `code 0: language "ruby": want python or shell`},
		{"timeout", `{"timeout": -1, "codes": ["print(1)"]}`, `code 0: timeout -1: want a number of seconds or a duration such as "1.5s", more than 0 and at most 24h0m0s`},
		{"absurd", `{"timeout": 1e12, "codes": ["print(1)"]}`, "code 0: timeout 1e12: want a number of seconds"},
		{"duration", `{"codes": [{"code": "print(1)", "timeout": "1000000h"}]}`, `code 0: timeout "1000000h": want a number of seconds`},
		{"malformed", `{"codes": ["print(1)"`, "parse batch: unexpected EOF"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
		if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		res := flmbox(t, root, "run", "--batch", p, "--image", reg.digestRef())
		if res.code != 125 || res.stdout != "" || !strings.Contains(res.stderr, "flmbox: "+tc.reason) {
			t.Errorf("%s: exit %d stdout %q stderr %q, want 125 and %q", tc.name, res.code, res.stdout, res.stderr, tc.reason)
		}
	}
	if ls := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(ls) != "[]" {
		t.Errorf("sandboxes after refused batches: %s", ls)
	}
	// A timeout over the bound is echoed as given, not in milliseconds.
	res := flmbox(t, root, "run", "--sandbox", "none", "--timeout", "1000000h", "-c", "print(1)")
	if want := "flmbox: timeout 1000000h0m0s: want more than 0 and at most 24h0m0s"; res.code != 125 || !strings.Contains(res.stderr, want) {
		t.Errorf("--timeout 1000000h: exit %d stderr %q, want 125 and %q", res.code, res.stderr, want)
	}
}

func TestRunFreshSandboxTimeoutAndEnvironment(t *testing.T) {
	// Not parallel: t.Setenv.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	t.Setenv("FLMBOX_TEST_SECRET", "hunter2")
	out := mustFlmbox(t, root, "run", "--image", reg.digestRef(), "--env", "GREETING=hi", "-c",
		"import os, sys; print(os.environ.get('GREETING'), os.environ.get('PYTHONPATH'), os.environ.get('HOME'), 'FLMBOX_TEST_SECRET' in os.environ, os.getuid())")
	if out != "hi /tmp/site-packages /tmp False 65534\n" {
		t.Fatalf("environment: %q", out)
	}
	res := flmbox(t, root, "run", "--image", reg.digestRef(), "--timeout", "1s", "-c", "while True: pass")
	if res.code != 124 || !strings.Contains(res.stderr, "timed out") {
		t.Fatalf("timeout: exit %d %q", res.code, res.stderr)
	}
	res = flmbox(t, root, "run", "--image", reg.digestRef(), "--json", "-c", "import sys; sys.stdout.buffer.write(b'\\xff\\xfeok'); sys.exit(3)")
	var j map[string]any
	if err := json.Unmarshal([]byte(res.stdout), &j); err != nil || res.code != 3 || j["exit_code"] != 3.0 || j["stdout_base64"] != "//5vaw==" {
		t.Fatalf("--json with non-UTF-8 output: exit %d %s %v", res.code, res.stdout, err)
	}
	if ls := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(ls) != "[]" {
		t.Errorf("sandboxes left: %s", ls)
	}
}

func TestRunOnADeadSandboxFailsAtOnce(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	mustFlmbox(t, root, "sandbox", "create", "--name", "doomed", "--image", reg.digestRef())
	// The ID is a pattern for pkill run as root: an empty one would match
	// every process on the machine.
	rec, err := record.Read(root, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID == "" {
		t.Fatalf("sandbox doomed's record has no runsc container ID: %+v", rec)
	}
	if out, err := exec.Command("pkill", "-9", "-f", rec.ID).CombinedOutput(); err != nil {
		t.Fatalf("pkill -9 -f %s (the sandbox's runsc processes): %v %s", rec.ID, err, out)
	}
	// SIGKILL is delivered asynchronously: wait until no runsc process
	// names the ID any more (pgrep exits 1 when nothing matches).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, err := exec.Command("pgrep", "-a", "-f", rec.ID).Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 {
			break
		}
		if err != nil {
			t.Fatalf("pgrep -f %s: %v", rec.ID, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("runsc processes of sandbox doomed still alive 30s after SIGKILL:\n%s", out)
		}
	}
	res := flmbox(t, root, "run", "--sandbox", "doomed", "-c", "print(1)")
	if res.code != 125 || !strings.Contains(res.stderr, "dead") {
		t.Fatalf("run on a dead sandbox: exit %d %q", res.code, res.stderr)
	}
	if ls := mustFlmbox(t, root, "sandbox", "ls"); !strings.Contains(ls, "dead") {
		t.Fatalf("sandbox ls:\n%s", ls)
	}
	mustFlmbox(t, root, "sandbox", "rm", "doomed")
	mustFlmbox(t, root, "sandbox", "rm", "doomed") // idempotent
}

func TestNetworkNoneCannotReachTheHost(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "host-ok") })}
	go srv.Serve(ln)
	defer srv.Close()
	// The timeout only bounds a failure: with --network host the server
	// answers, with --network none the connection is refused at once.
	code := fmt.Sprintf(`
import errno, urllib.error, urllib.request
try:
    print(urllib.request.urlopen("http://%s/", timeout=60).read().decode())
except urllib.error.URLError as e:
    print("unreachable", type(e.reason).__name__, errno.errorcode.get(getattr(e.reason, "errno", None)))
`, ln.Addr())
	// A connection error, not a timeout: nothing answers on the sandbox's
	// own loopback, and there is no other interface.
	out := mustFlmbox(t, root, "run", "--image", reg.digestRef(), "-c", code)
	if out != "unreachable ConnectionRefusedError ECONNREFUSED\n" && !strings.HasSuffix(out, " ENETUNREACH\n") && !strings.HasSuffix(out, " EHOSTUNREACH\n") {
		t.Fatalf("--network none: %q, want the connection to the host refused or unreachable", out)
	}
	t.Logf("--network none: %s", strings.TrimSpace(out))
	if out := mustFlmbox(t, root, "run", "--image", reg.digestRef(), "--network", "host", "-c", code); out != "host-ok\n" {
		t.Fatalf("--network host: %q", out)
	}
}

// TestBatchSaysWhyASnippetWasKilled: a snippet killed on timeout says so in
// its stderr (and timed_out), and the others run.
func TestBatchSaysWhyASnippetWasKilled(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "batch-kill")
	// The timeout is long enough for the snippet to print first, even on a
	// loaded machine; the sleep is far past it.
	in := `{"language": "python", "timeout": 30, "codes": [{"code": "import time\nprint('started', flush=True)\ntime.sleep(60)", "timeout": 3}, "print('next')"]}`
	results := runBatch(t, root, []byte(in), 2, "--sandbox", "batch-kill")
	if r := results[0]; r.ExitCode != 137 || r.Stdout != "started\n" || r.Stderr != "flmbox: the snippet timed out after 3s and was killed\n" {
		t.Errorf("the timed-out snippet: %+v", r)
	}
	if r := results[1]; r.ExitCode != 0 || r.Stdout != "next\n" {
		t.Errorf("the next snippet: %+v", r)
	}
}

// TestBatchKeepsWhatSingleRunsKeep: a batch element has run --json's
// timed_out, oom_killed, duration_ms and, for output that is not UTF-8,
// stdout_base64/stderr_base64; timeouts are seconds or durations, and
// --language and --timeout are the defaults of codes that set neither, in
// the batch or in the code.
func TestBatchKeepsWhatSingleRunsKeep(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "batch-fields")
	in := `{"timeout": "20s", "codes": [
		{"language": "python", "code": "import sys; sys.stdout.buffer.write(b'\\xff\\xfeok'); sys.stderr.buffer.write(b'\\x80')"},
		{"code": "sleep 60", "timeout": "1.5s"},
		"echo shell $((6 * 7))"]}`
	results := runBatch(t, root, []byte(in), 3, "--sandbox", "batch-fields", "--language", "shell", "--json")
	for i, r := range results {
		if r.TimedOut == nil || r.OOMKilled == nil || r.DurationMS == nil || *r.OOMKilled || (*r.TimedOut != (i == 1)) || *r.DurationMS <= 0 {
			t.Errorf("element %d: timed_out %v oom_killed %v duration_ms %v", i, r.TimedOut, r.OOMKilled, r.DurationMS)
		}
	}
	if r := results[0]; r.ExitCode != 0 || r.Stdout != "\uFFFDok" || r.StdoutBase64 != "//5vaw==" || r.StderrBase64 != "gA==" {
		t.Errorf("non-UTF-8 output: %+v", r)
	}
	if r := results[1]; r.ExitCode != 137 || r.Stderr != "flmbox: the snippet timed out after 1.5s and was killed\n" || r.StdoutBase64 != "" {
		t.Errorf("timed out: %+v", r)
	}
	if r := results[2]; r.ExitCode != 0 || r.Stdout != "shell 42\n" {
		t.Errorf("--language shell: %+v", r)
	}
	// --timeout is the timeout of a batch that sets none.
	results = runBatch(t, root, []byte(`{"codes": ["sleep 60"]}`), 1, "--sandbox", "batch-fields", "-l", "shell", "--timeout", "1s")
	if r := results[0]; r.ExitCode != 137 || r.TimedOut == nil || !*r.TimedOut || r.Stderr != "flmbox: the snippet timed out after 1s and was killed\n" {
		t.Errorf("--timeout: %+v", r)
	}
}
