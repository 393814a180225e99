package bench

import (
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

func TestThroughputWant(t *testing.T) {
	for _, n := range []int64{0, 1, 2, 10, 12345} {
		var sum big.Int
		for i := int64(0); i < n; i++ {
			sum.Add(&sum, big.NewInt(i*i))
		}
		if got, want := throughputWant(n), sum.String()+"\n"; got != want {
			t.Errorf("throughputWant(%d) = %q, want %q", n, got, want)
		}
	}
	if got := throughputCode(5); got != "print(sum(i * i for i in range(5)))" {
		t.Errorf("throughputCode = %q", got)
	}
}

// TestWriteBatch checks the batch file against `flmbox run --batch`'s
// input format: {"language", "timeout", "codes": [{"code"}...]}, no other
// key (the CLI refuses unknown ones).
func TestWriteBatch(t *testing.T) {
	file := filepath.Join(t.TempDir(), "b.json")
	if err := writeBatch(file, sandbox.Shell, 0, "echo a", "echo b"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(data), `{"language":"shell","codes":[{"code":"echo a"},{"code":"echo b"}]}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if err := writeBatch(file, sandbox.Python, 300, "print(1)"); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(file)
	if got, want := string(data), `{"language":"python","timeout":300,"codes":[{"code":"print(1)"}]}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestCheckResults(t *testing.T) {
	ok := &sandbox.Result{Stdout: sandbox.Output{Data: []byte(wantOutput)}}
	for _, tc := range []struct {
		name string
		res  *sandbox.Result
		err  string
	}{
		{"ok", ok, ""},
		{"exit 1", &sandbox.Result{ExitCode: 1, Stdout: ok.Stdout}, "exit 1"},
		{"stderr", &sandbox.Result{Stdout: ok.Stdout, Stderr: sandbox.Output{Data: []byte("warning")}}, `stderr "warning"`},
		{"not run", &sandbox.Result{ExitCode: -1}, "exit -1"},
		{"output", &sandbox.Result{Stdout: sandbox.Output{Data: []byte("agent-perf-ok")}}, "check the output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkResult("x", tc.res)
			if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("checkResult: %v, want %q", err, tc.err)
			}
			err = checkBatchResult("x", []sandbox.BatchResult{{Ran: true, Result: tc.res}})
			if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("checkBatchResult: %v, want %q", err, tc.err)
			}
		})
	}
	failed := errors.New("sandbox died")
	if err := checkBatchResult("x", []sandbox.BatchResult{{Ran: true, Err: failed}}); !errors.Is(err, failed) {
		t.Errorf("a snippet flmbox failed to run: %v", err)
	}
	if err := checkBatchResult("x", []sandbox.BatchResult{{}}); err == nil || !strings.Contains(err.Error(), "did not run") {
		t.Errorf("a snippet that did not run: %v", err)
	}
	if err := checkBatchResult("x", nil); err == nil {
		t.Error("no result")
	}
}

// TestTimeToOutput times a command until its output, not until it exits.
func TestTimeToOutput(t *testing.T) {
	d, err := timeToOutput(exec.Command("sh", "-c", "echo agent-perf-ok; exec sleep 1"), wantOutput)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 || d >= time.Second {
		t.Errorf("%s until the output, want less than the 1 s the command takes", d)
	}
	if _, err := timeToOutput(exec.Command("sh", "-c", "echo agent-perf-ok; echo more"), wantOutput); err == nil || !strings.Contains(err.Error(), "check the output") {
		t.Errorf("more output: %v", err)
	}
	if _, err := timeToOutput(exec.Command("sh", "-c", "echo agent-perf-ok; echo oops >&2; exit 3"), wantOutput); err == nil || !strings.Contains(err.Error(), "oops") {
		t.Errorf("a failure: %v", err)
	}
}

// TestCommandFailed checks that a command's exit status is described, not
// wrapped (a front would exit with it), and its stderr quoted.
func TestCommandFailed(t *testing.T) {
	_, _, err := timeCommand(exec.Command("sh", "-c", "echo one >&2; echo two >&2; exit 7"))
	var ee *exec.ExitError
	if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "exit status 7") || !strings.Contains(err.Error(), "one\ntwo") {
		t.Fatalf("got %v", err)
	}
	d, err := checkedCommand(exec.Command("sh", "-c", "echo agent-perf-ok"))
	if err != nil || d <= 0 {
		t.Fatalf("checkedCommand: %s, %v", d, err)
	}
	if got := commandLine(exec.Command("a", "1", "2", "3", "4", "5", "6", "7", "8", "9")); got != "a 1 2 3 4 5 6 7 …" {
		t.Errorf("commandLine = %q", got)
	}
	if got := lastLines("a\nb\nc\n", 2); got != "b\nc" {
		t.Errorf("lastLines = %q", got)
	}
}

func TestRequest(t *testing.T) {
	for _, s := range []snippet{pythonSnippet, shellSnippet} {
		req := s.request()
		if err := req.Validate(); err != nil {
			t.Errorf("%s: %v", s.language, err)
		}
		if req.Timeout != 30*time.Second || req.MaxOutput != sandbox.DefaultMaxOutput || req.Reset {
			t.Errorf("%s: %+v", s.language, req)
		}
		if s.argv[len(s.argv)-1] != s.code {
			t.Errorf("%s: runsc exec and chroot run %q, not the snippet %q", s.language, s.argv, s.code)
		}
	}
}
