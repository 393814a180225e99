package runcmd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// TestPrintStatus: the exit status and the explanation flmbox run gives
// for each way a snippet can end.
func TestPrintStatus(t *testing.T) {
	out := wire.Output{Data: []byte("partial\n"), Total: 8}
	for _, tc := range []struct {
		name   string
		res    wire.Result
		code   int
		stderr string // in plain mode, after the snippet's own
		msg    string
	}{
		{"exit", wire.Result{ExitCode: 3, Stdout: out}, 3, "", ""},
		{"timeout", wire.Result{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, Stdout: out}, ExitTimeout, "flmbox: the snippet timed out after 2s and was killed\n", ""},
		{"out of memory", wire.Result{ExitCode: 137, Signal: "SIGKILL", OOMKilled: true, Stdout: out}, 137, "flmbox: the snippet was killed: the sandbox was running out of memory (its processes and its files under /tmp count together; flmbox sandbox create --memory sets the limit)\n", ""},
		{"killed", wire.Result{ExitCode: 137, Signal: "SIGKILL", Stdout: out}, 137, "", ""},
		{"interrupted", wire.Result{ExitCode: 137, Signal: "SIGKILL", Interrupted: true, Stdout: out}, ExitInterrupted, "", ""},
		{"error", wire.Result{ExitCode: -1, Error: "no python3"}, ExitFlmboxFailed, "", "run snippet: no python3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code, msg, err := Print(&stdout, &stderr, &tc.res, false, 2*time.Second)
			if err != nil || code != tc.code || msg != tc.msg || stdout.String() != string(tc.res.Stdout.Data) || stderr.String() != tc.stderr {
				t.Fatalf("plain: code %d msg %q err %v stdout %q stderr %q", code, msg, err, stdout.String(), stderr.String())
			}
			stdout.Reset()
			stderr.Reset()
			code, msg, err = Print(&stdout, &stderr, &tc.res, true, 2*time.Second)
			var j JSON
			if jerr := json.Unmarshal(stdout.Bytes(), &j); jerr != nil || err != nil || code != tc.code || msg != tc.msg || stderr.Len() != 0 {
				t.Fatalf("json: code %d msg %q err %v/%v stdout %q stderr %q", code, msg, err, jerr, stdout.String(), stderr.String())
			}
			if j.OOMKilled != tc.res.OOMKilled || j.TimedOut != tc.res.TimedOut || j.Interrupted != tc.res.Interrupted || j.ExitCode != tc.res.ExitCode || !strings.Contains(stdout.String(), `"oom_killed":`) {
				t.Fatalf("json: %s", stdout.String())
			}
		})
	}
}
