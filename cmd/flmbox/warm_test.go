package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/snippet/wire"
)

func TestParseWarmCall(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	none := env(nil)
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	def := func(edit func(w *warmCall)) *warmCall {
		w := &warmCall{root: runcmd.DefaultRoot, sandbox: "sb", language: wire.LanguagePython, timeout: 30 * time.Second,
			maxOutput: wire.DefaultMaxOutput, code: "print(1)", hasCode: true}
		edit(w)
		return w
	}
	for _, tc := range []struct {
		name string
		args string
		env  func(string) (string, bool)
		want *warmCall // nil: handed to flmbox-core
	}{
		{"plain", "run --sandbox sb -c print(1)", none, def(func(*warmCall) {})},
		{"equals forms and single dashes", "run -sandbox=sb --code=print(1)", none, def(func(*warmCall) {})},
		{"every flag", "--root /r --runsc /x run --sandbox sb -l shell --timeout 2s --reset --json -c print(1)", none,
			def(func(w *warmCall) {
				w.root, w.language, w.timeout, w.reset, w.json = "/r", "shell", 2*time.Second, true, true
			})},
		{"root from the environment", "run --sandbox sb -c print(1)", env(map[string]string{"FLMBOX_ROOT": "/e"}), def(func(w *warmCall) { w.root = "/e" })},
		{"an empty root from the environment", "run --sandbox sb -c print(1)", env(map[string]string{"FLMBOX_ROOT": ""}), nil},
		{"an empty root", "--root= run --sandbox sb -c print(1)", none, nil},
		{"FLMBOX_DEBUG empty", "run --sandbox sb -c print(1)", env(map[string]string{"FLMBOX_DEBUG": ""}), def(func(*warmCall) {})},
		{"a relative root, made absolute", "--root rel/dir run --sandbox sb -c print(1)", none, def(func(w *warmCall) { w.root = filepath.Join(cwd, "rel/dir") })},
		{"--root wins over the environment", "--root=/f run --sandbox sb -c print(1)", env(map[string]string{"FLMBOX_ROOT": "/e"}), def(func(w *warmCall) { w.root = "/f" })},
		{"a file", "run --sandbox sb code.py", none, def(func(w *warmCall) { w.code, w.hasCode, w.file = "", false, "code.py" })},
		{"flags after the file", "run code.py --sandbox sb --json", none, def(func(w *warmCall) { w.code, w.hasCode, w.file, w.json = "", false, "code.py", true })},
		{"a file after --", "run --sandbox sb -- -weird.py", none, def(func(w *warmCall) { w.code, w.hasCode, w.file = "", false, "-weird.py" })},
		{"the call's environment", "run --sandbox sb -e K=V -e A=b=c -e=L=x,y -c print(1)", none, def(func(w *warmCall) { w.env = []string{"K=V", "A=b=c", "L=x,y"} })},
		{"the call's environment, long", "run --sandbox sb --env K=V --env=A=b=c -c print(1)", none, def(func(w *warmCall) { w.env = []string{"K=V", "A=b=c"} })},
		{"two forms of one flag (refused by flmbox-core)", "run --sandbox sb -e K=V --env=A=b=c -c print(1)", none, nil},
		{"code in two forms", "run --sandbox sb -c 1 --code 2", none, nil},
		{"PYTHONPATH (the sandbox's site-packages first)", "run --sandbox sb -e PYTHONPATH=/x -c 1", none, nil},
		{"an environment without its value", "run --sandbox sb -c 1 -e", none, nil},
		{"stdin for the snippet", "run --sandbox sb -i -c 1", none, nil},
		{"a copy", "run --sandbox sb --copy a:/tmp/a -c 1", none, nil},
		{"boolean set false", "run --sandbox sb --json=false -c print(1)", none, def(func(*warmCall) {})},
		{"last flag wins", "run --sandbox a --sandbox sb -c print(1)", none, def(func(*warmCall) {})},

		{"no command", "--root /r", none, nil},
		{"another command", "sandbox ls", none, nil},
		{"help", "run --help", none, nil},
		{"a debug run", "--debug run --sandbox sb -c 1", none, nil},
		{"a fresh sandbox", "run --image img -c 1", none, nil},
		{"a batch", "run --sandbox sb --batch f.json", none, nil},
		{"a callback", "run --sandbox sb --callback /s.sock -c 1", none, nil},
		{"a callback after the code", "run --sandbox sb -c 1 --callback=/s.sock", none, nil},
		{"a callback after the file", "run --sandbox sb code.py --callback /s.sock", none, nil},
		{"a callback variable", "run --sandbox sb --callback /s.sock --callback-env HERMES_RPC_SOCKET -c 1", none, nil},
		{"callback limits alone", "run --sandbox sb --callback-conns 5 --callback-bytes 1024 --callback-idle 1s -c 1", none, nil},
		{"max output in bytes", "run --sandbox sb --max-output 4096 -c print(1)", none, def(func(w *warmCall) { w.maxOutput = 4096 })},
		{"max output with a unit", "run --sandbox sb --max-output 1k -c 1", none, nil},
		{"max output signed", "run --sandbox sb --max-output +4096 -c 1", none, nil},
		{"max output zero", "run --sandbox sb --max-output 0 -c 1", none, nil},
		{"no sandbox", "run -c 1", none, nil},
		{"code on stdin", "run --sandbox sb -", none, nil},
		{"no code", "run --sandbox sb", none, nil},
		{"code twice", "run --sandbox sb -c 1 f.py", none, nil},
		{"two files", "run --sandbox sb a.py b.py", none, nil},
		{"a bad timeout", "run --sandbox sb --timeout soon -c 1", none, nil},
		{"a bad boolean", "run --sandbox sb --json=maybe -c 1", none, nil},
		{"a flag without its value", "run -c 1 --sandbox", none, nil},
		{"a global flag after run", "run --root /r --sandbox sb -c 1", none, nil},
		{"FLMBOX_DEBUG set", "run --sandbox sb -c 1", env(map[string]string{"FLMBOX_DEBUG": "maybe"}), nil},
		{"-- after the file", "run --sandbox sb code.py --", none, nil},
		{"-- after the file and a flag", "run --sandbox sb code.py --json --", none, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseWarmCall(strings.Fields(tc.args), tc.env)
			if tc.want == nil {
				if ok {
					t.Fatalf("parsed %+v, want it handed to flmbox-core", got)
				}
				return
			}
			if !ok || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v (%v), want %+v", got, ok, tc.want)
			}
		})
	}
}

// TestWarmCallHandsOver: a call that cannot be made is not handled, and
// prints nothing, so that flmbox-core runs it and says why.
func TestWarmCallHandsOver(t *testing.T) {
	root := t.TempDir()
	dead := stateroot.Sandbox(root, "dead")
	if err := os.MkdirAll(dead, 0o700); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"name": "dead", "state": "running", "limits": map[string]int64{"memory_bytes": 1 << 29, "pids": 256}})
	if err := os.WriteFile(filepath.Join(dead, "sandbox.json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	fakeAgent(t, root, "creating", func([]byte) []byte { t.Error("a sandbox being created was called"); return nil })
	setState(t, root, "creating", "creating")
	for _, tc := range []struct{ name, args string }{
		{"no such sandbox", "run --sandbox nosuch -c 1"},
		{"a bad name", "run --sandbox ../x -c 1"},
		{"a dead sandbox (no socket)", "run --sandbox dead -c 1"},
		{"a missing file", "run --sandbox dead /nonexistent.py"},
		{"a file that is not a regular file (read once)", "run --sandbox dead /dev/null"},
		{"an unknown language", "run --sandbox dead -l ruby -c 1"},
		{"a zero timeout", "run --sandbox dead --timeout 0s -c 1"},
		{"a sandbox being created", "run --sandbox creating -c 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, ok := parseWarmCall(append([]string{"--root", root}, strings.Fields(tc.args)...), func(string) (string, bool) { return "", false })
			if !ok {
				t.Fatal("not parsed")
			}
			var stdout, stderr bytes.Buffer
			if _, handled := w.run(t.Context(), &stdout, &stderr); handled || stdout.Len()+stderr.Len() != 0 {
				t.Fatalf("handled %v, printed %q %q", handled, stdout.String(), stderr.String())
			}
		})
	}
}

// fakeAgent serves one sandbox's socket under root: answer is called with
// each request read and returns what to write back (nothing: hang up).
func fakeAgent(t *testing.T, root, name string, answer func(req []byte) []byte) net.Listener {
	t.Helper()
	dir := stateroot.Sandbox(root, name)
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"name": name, "state": "running", "limits": map[string]int64{"memory_bytes": 1 << 29, "pids": 256}})
	if err := os.WriteFile(filepath.Join(dir, "sandbox.json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "run", "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			req, _ := bufio.NewReader(c).ReadBytes('\n')
			c.Write(answer(req))
			c.Close()
		}
	}()
	return ln
}

// TestWarmCallAnswered: a call is made here, with the sandbox's limits, and
// its result printed as flmbox-core prints it.
func TestWarmCallAnswered(t *testing.T) {
	root := t.TempDir()
	var got wire.Request
	fakeAgent(t, root, "sb", func(req []byte) []byte {
		got = wire.Request{}
		json.Unmarshal(req, &got)
		return []byte(`{"version":` + strconv.Itoa(wire.ProtocolVersion) + `,"exit_code":3,"stdout":{"data":"aGkK","total":3},"stderr":{"data":"","total":0},"duration_ms":1}` + "\n")
	})
	w, ok := parseWarmCall([]string{"--root", root, "run", "--sandbox", "sb", "-l", "shell", "-e", "K=V", "-c", "echo hi; exit 3"}, func(string) (string, bool) { return "", false })
	if !ok {
		t.Fatal("not parsed")
	}
	var stdout, stderr bytes.Buffer
	code, handled := w.run(t.Context(), &stdout, &stderr)
	if !handled || code != 3 || stdout.String() != "hi\n" || stderr.Len() != 0 {
		t.Fatalf("handled %v, exit %d, printed %q %q", handled, code, stdout.String(), stderr.String())
	}
	if got.Code != "echo hi; exit 3" || got.Language != "shell" || got.Limits != (wire.Limits{Procs: 256}) || got.File != "" ||
		len(got.Env) != 1 || got.Env[0] != "K=V" {
		t.Errorf("the agent got %+v", got)
	}

	// FILE runs as a file of its base name, as python3 FILE (and
	// flmbox-core) run it.
	script := filepath.Join(t.TempDir(), "main.py")
	if err := os.WriteFile(script, []byte("print(__file__)"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, _ = parseWarmCall([]string{"--root", root, "run", "--sandbox", "sb", script}, func(string) (string, bool) { return "", false })
	if _, handled := w.run(t.Context(), &stdout, &stderr); !handled || got.Code != "print(__file__)" || got.File != "main.py" || got.Env != nil {
		t.Errorf("handled %v, the agent got %+v", handled, got)
	}
}

// setState rewrites the state in sandbox name's record.
func setState(t *testing.T, root, name, state string) {
	t.Helper()
	p := filepath.Join(stateroot.Sandbox(root, name), "sandbox.json")
	var rec map[string]any
	b, _ := os.ReadFile(p)
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	rec["state"] = state
	b, _ = json.Marshal(rec)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestWarmCallHungUp: an agent that reads the request and hangs up may have
// run it, so flmbox reports the failure itself, as flmbox-core would, and
// never hands the call over (which would send it again): the sandbox is
// dead if its agent no longer accepts connections.
func TestWarmCallHungUp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dies   bool
		stderr []string
	}{
		{"alive", false, []string{"hung up without an answer", "flmbox: flmbox sandbox ls shows its state"}},
		{"dead", true, []string{"the sandbox is dead", "flmbox: remove it with flmbox sandbox rm sb and create another"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			calls := 0
			var ln net.Listener
			ln = fakeAgent(t, root, "sb", func(req []byte) []byte {
				if len(req) == 0 {
					return nil // a connection that only checks the agent accepts
				}
				calls++
				if tc.dies {
					ln.Close()
				}
				return nil
			})
			w, _ := parseWarmCall([]string{"--root", root, "run", "--sandbox", "sb", "-c", "1"}, func(string) (string, bool) { return "", false })
			var stdout, stderr bytes.Buffer
			code, handled := w.run(t.Context(), &stdout, &stderr)
			if !handled || code != runcmd.ExitFlmboxFailed || stdout.Len() != 0 || calls != 1 {
				t.Fatalf("handled %v, exit %d, %d calls, printed %q %q", handled, code, calls, stdout.String(), stderr.String())
			}
			for _, want := range tc.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr %q: want %q", stderr.String(), want)
				}
			}
		})
	}
}

// TestFlagsNotWarmHandOver: a run flag that the table does not mark Warm
// (--callback and its limits among them), written either way, hands the
// command line to flmbox-core.
func TestFlagsNotWarmHandOver(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, f := range runcmd.RunFlags {
		if f.Warm {
			continue
		}
		for _, n := range f.Names() {
			for _, args := range [][]string{
				{"run", "--sandbox", "sb", "--" + n, "1", "-c", "1"},
				{"run", "--sandbox", "sb", "-c", "1", "--" + n + "=1"},
			} {
				if w, ok := parseWarmCall(args, none); ok {
					t.Errorf("%v: parsed as a warm call %+v", args, w)
				}
			}
		}
	}
}
