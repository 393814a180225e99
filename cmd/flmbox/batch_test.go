package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/snippet/wire"
)

func TestParseBatchCall(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		name, args string
		parallel   int
		ok         bool
	}{
		{"plain", "run --batch b.json --sandbox sb", 0, true},
		{"parallel and run flags", "run --sandbox sb --batch=b.json --parallel 3 -l shell --timeout 2s --json -e K=V", 3, true},
		{"parallel not decimal", "run --sandbox sb --batch b.json --parallel 0x3", 0, false},
		{"stdin", "run --sandbox sb --batch -", 0, false},
		{"code too", "run --sandbox sb --batch b.json -c 1", 0, false},
		{"a file too", "run --sandbox sb --batch b.json x.py", 0, false},
		{"reset", "run --sandbox sb --batch b.json --reset", 0, false},
		{"fresh sandboxes", "run --image img@sha256:1 --batch b.json", 0, false},
		{"a callback", "run --sandbox sb --batch b.json --callback /s", 0, false},
		{"a warm call", "run --sandbox sb -c 1", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, ok := parseBatchCall(strings.Fields(tc.args), none)
			if ok != tc.ok || ok && (w.batch != "b.json" || w.sandbox != "sb" || w.parallel != tc.parallel) {
				t.Fatalf("got %+v, %v; want ok %v", w, ok, tc.ok)
			}
		})
	}
}

// TestBatchAnswered: a batch on a running sandbox is run here, each code
// a call with its own language and timeout, and printed as flmbox-core
// prints it; a batch flmbox-core must refuse is handed over.
func TestBatchAnswered(t *testing.T) {
	root := t.TempDir()
	var mu sync.Mutex
	var got []wire.Request
	fakeAgent(t, root, "sb", func(req []byte) []byte {
		var r wire.Request
		json.Unmarshal(req, &r)
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
		return []byte(`{"version":` + strconv.Itoa(wire.ProtocolVersion) + `,"exit_code":3,"stdout":{"data":"aGkK","total":3},"stderr":{"data":"","total":0},"duration_ms":1}` + "\n")
	})
	batch := filepath.Join(t.TempDir(), "b.json")
	none := func(string) (string, bool) { return "", false }
	run := func(input string) (int, bool, string, string) {
		if err := os.WriteFile(batch, []byte(input), 0o600); err != nil {
			t.Fatal(err)
		}
		got = nil
		w, ok := parseBatchCall([]string{"--root", root, "run", "--batch", batch, "--sandbox", "sb", "--parallel", "1", "-e", "K=V"}, none)
		if !ok {
			t.Fatal("not parsed")
		}
		var stdout, stderr bytes.Buffer
		code, handled := w.runBatch(t.Context(), &stdout, &stderr)
		return code, handled, stdout.String(), stderr.String()
	}
	code, handled, stdout, stderr := run(`{"language": "shell", "codes": ["echo hi", {"language": "python", "code": "print(1)", "timeout": 0.5}]}`)
	if !handled || code != 0 || stderr != "" {
		t.Fatalf("handled %v, exit %d, stderr %q", handled, code, stderr)
	}
	want := []runcmd.BatchResult{{ExitCode: 3, Stdout: "hi\n", DurationMS: 1}, {ExitCode: 3, Stdout: "hi\n", DurationMS: 1}}
	var out []runcmd.BatchResult
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || !reflect.DeepEqual(out, want) {
		t.Fatalf("printed %s (%v), want %+v", stdout, err, want)
	}
	if len(got) != 2 || got[0].Language != "shell" || got[0].Code != "echo hi" || got[0].TimeoutMS != (30*time.Second).Milliseconds() ||
		got[1].Language != "python" || got[1].TimeoutMS != 500 || got[1].Env[0] != "K=V" || got[1].Limits != (wire.Limits{Procs: 256}) {
		t.Errorf("the agent got %+v", got)
	}
	for _, bad := range []string{`{"codes": []}`, `{"codes": ["x"], "extra": 1}`, `{"codes": [{"code": "x", "timeout": -1}]}`, `not json`} {
		if _, handled, _, _ := run(bad); handled || len(got) != 0 {
			t.Errorf("%s: handled %v, the agent got %+v; want it handed to flmbox-core", bad, handled, got)
		}
	}
	setState(t, root, "sb", "suspended")
	if _, handled, _, _ := run(`{"codes": ["x"]}`); handled || len(got) != 0 {
		t.Errorf("a suspended sandbox: handled %v, the agent got %+v; want it handed to flmbox-core", handled, got)
	}
}
