package runcmd

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// TestPrintStatus: the exit status and the explanation flmbox run gives
// for each way a snippet can end.
func TestPrintStatus(t *testing.T) {
	out := Output{Data: []byte("partial\n"), Total: 8}
	for _, tc := range []struct {
		name   string
		res    Result
		code   int
		stderr string // in plain mode, after the snippet's own
		msg    string
	}{
		{"exit", Result{ExitCode: 3, Stdout: out}, 3, "", ""},
		{"timeout", Result{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, Stdout: out}, ExitTimeout, "flmbox: the snippet timed out after 2s and was killed\n", ""},
		{"out of memory", Result{ExitCode: 137, Signal: "SIGKILL", OOMKilled: true, Stdout: out}, 137, "flmbox: the snippet was killed: the sandbox was running out of memory (its processes and its files under /tmp count together; flmbox sandbox create --memory sets the limit)\n", ""},
		{"killed", Result{ExitCode: 137, Signal: "SIGKILL", Stdout: out}, 137, "", ""},
		{"interrupted", Result{ExitCode: 137, Signal: "SIGKILL", Interrupted: true, Stdout: out}, ExitInterrupted, "", ""},
		{"error", Result{ExitCode: -1, Error: "no python3"}, ExitFlmboxFailed, "", "run snippet: no python3"},
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
			// The object's stderr says what plain mode says after the
			// snippet's own, or why flmbox could not run it.
			if want := tc.stderr + tc.res.Error; j.Stderr != want {
				t.Fatalf("json: stderr %q, want %q", j.Stderr, want)
			}
			if j.OOMKilled != tc.res.OOMKilled || j.TimedOut != tc.res.TimedOut || j.Interrupted != tc.res.Interrupted || j.ExitCode != tc.res.ExitCode || !strings.Contains(stdout.String(), `"oom_killed":`) {
				t.Fatalf("json: %s", stdout.String())
			}
		})
	}
}

// TestCallbacks: --json carries a call's callback counts (and only for a
// call with --callback); plain mode says on stderr when connections were
// refused, and why as far as the counts tell.
func TestCallbacks(t *testing.T) {
	res := &Result{Callbacks: &Callbacks{Connections: 50, Refused: 1, BytesIn: 7, BytesOut: 9}}
	var stdout, stderr bytes.Buffer
	if _, _, err := Print(&stdout, &stderr, res, true, time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), `"callbacks":{"connections":50,"refused":1,"bytes_in":7,"bytes_out":9}`) {
		t.Errorf("json: %s", stdout.String())
	}
	stdout.Reset()
	Print(&stdout, &stderr, &Result{}, true, time.Second)
	if strings.Contains(stdout.String(), "callbacks") {
		t.Errorf("json without callbacks: %s", stdout.String())
	}
	for _, tc := range []struct {
		stats *Callbacks
		want  string
	}{
		{nil, ""},
		{&Callbacks{Connections: 3}, ""},
		{&Callbacks{Connections: 50, Refused: 1}, "flmbox: 1 callback connection refused: over the limit of 50 per call (--callback-conns)\n"},
		{&Callbacks{Connections: 2, Refused: 3}, "flmbox: 3 callback connections refused: not accepted by the host's socket, or made from outside the call's processes\n"},
	} {
		if got := CallbackNote(&Result{Callbacks: tc.stats}, 50); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.stats, got, tc.want)
		}
	}
}

// TestRunFlags: the defaults written in the table are the protocol's, and
// no callback flag is Warm (the flmbox command cannot forward connections:
// it hands such a call to flmbox-core).
func TestRunFlags(t *testing.T) {
	if DefaultCallbackBytes != "256MiB" || wire.DefaultCallbackBytes != 256<<20 {
		t.Errorf("--callback-bytes' default %s, the protocol's %d", DefaultCallbackBytes, wire.DefaultCallbackBytes)
	}
	for _, f := range RunFlags {
		if strings.HasPrefix(f.Name, "callback") && f.Warm {
			t.Errorf("--%s is Warm", f.Name)
		}
		switch f.Name {
		case "callback-conns":
			if f.Default != strconv.Itoa(wire.DefaultCallbackConns) {
				t.Errorf("--callback-conns' default %s", f.Default)
			}
		case "callback-idle":
			if f.Default != "" || !strings.HasPrefix(f.DefaultText, "none") {
				t.Errorf("--callback-idle's default %s: want none (wire.Callback's)", f.Default)
			}
		}
	}
}

// TestPrintTruncated: a truncated stream is its exact prefix and its tail:
// plain mode writes both, one after the other, and says on stderr what
// was left out between them (an interrupted call too); --json carries the
// tail apart (with a base64 twin if it is not UTF-8) and flmbox's error
// at the end of stderr's tail; an output kept whole has no tail fields.
func TestPrintTruncated(t *testing.T) {
	res := &Result{ExitCode: 1, Interrupted: true, Error: "",
		Stdout: Output{Data: []byte("ab"), Tail: []byte("yz\xff"), Total: 1000, Truncated: true},
		Stderr: Output{Data: []byte("whole"), Total: 5}}
	var stdout, stderr bytes.Buffer
	code, _, err := Print(&stdout, &stderr, res, false, time.Second)
	wantErr := "whole" + "flmbox: stdout: 995 bytes left out between the first 2 and the last 3 (a larger --max-output keeps more)\n"
	if err != nil || code != ExitInterrupted || stdout.String() != "abyz\xff" || stderr.String() != wantErr {
		t.Fatalf("plain: exit %d, %v, stdout %q, stderr %q", code, err, stdout.String(), stderr.String())
	}
	j := ToJSON(res)
	if j.Stdout != "ab" || j.StdoutBase64 != "" || j.StdoutTail != "yz\uFFFD" || j.StdoutTailBase64 != "eXr/" || !j.StdoutTruncated || j.StdoutBytes != 1000 {
		t.Errorf("json stdout: %+v", j)
	}
	if j.Stderr != "whole" || j.StderrTail != "" || j.StderrTruncated {
		t.Errorf("json stderr: %+v", j)
	}
	stdout.Reset()
	Print(&stdout, &stderr, &Result{Stdout: Output{Data: []byte("x"), Total: 1}}, true, time.Second)
	if strings.Contains(stdout.String(), "tail") {
		t.Errorf("json of a whole output: %s", stdout.String())
	}
	// flmbox's words go at the end of stderr: its tail if it was cut.
	j = ToJSON(&Result{ExitCode: -1, Error: "agent gone", Stderr: Output{Data: []byte("a"), Tail: []byte("z"), Total: 9, Truncated: true}})
	if j.Stderr != "a" || j.StderrTail != "zagent gone" {
		t.Errorf("json error: %+v", j)
	}
}
