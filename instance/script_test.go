package instance

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/instance/flamepb"
	"github.com/flmbox/flmbox/sandbox"
)

func TestParseScript(t *testing.T) {
	for _, tc := range []struct {
		input string
		lang  string
		time  time.Duration
		err   error
	}{
		// flamepy's exact bytes.
		{`{"language":"python","code":"print(1)","input":null}`, "python", 30 * time.Second, nil},
		{`{"language":"Shell","code":"echo 1","input":[]}`, "shell", 30 * time.Second, nil},
		{`{"language":"PYTHON","runtime":"python3","code":"1","timeout":1.5}`, "python", 1500 * time.Millisecond, nil},
		{`{"language":"ruby","code":"puts 1"}`, "", 0, errdefs.ErrInvalidArgument},
		{`{"language":"python","runtime":"usr/bin/pypy","code":"1"}`, "", 0, errdefs.ErrInvalidArgument},
		{`{"language":"python","code":"1","env":{"A":"x\u0000"}}`, "", 0, errdefs.ErrInvalidArgument},
		{`{"language":"python","code":"1","env":{"":"x"}}`, "", 0, errdefs.ErrInvalidArgument},
		{`{"language":"python","code":"1","input":[300]}`, "", 0, errdefs.ErrInvalidArgument},
		{`{"language":"python","code":"1","surprise":1}`, "", 0, errdefs.ErrInvalidArgument},
		{`not json`, "", 0, errdefs.ErrInvalidArgument},
		{`{"language":"python","code":"a\u0000b"}`, "", 0, errdefs.ErrInvalidArgument},
	} {
		req, err := parseScript([]byte(tc.input), taskDefaults{Timeout: 30 * time.Second})
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s: error %v, want %v", tc.input, err, tc.err)
			}
			continue
		}
		if err != nil || req.req.Language != tc.lang || req.req.Timeout != tc.time {
			t.Errorf("%s: %+v %v", tc.input, req, err)
		}
	}
}

func TestParseScriptStdinEnvRuntime(t *testing.T) {
	tk, err := parseScript([]byte(`{"language":"shell","runtime":"bash","code":"cat","input":[104,105],"env":{"B":"2","A":"1"}}`), taskDefaults{Timeout: time.Second})
	req := tk.req
	if err != nil || string(req.Stdin) != "hi" || req.Interpreter != "bash" || !slices.Equal(req.Env, []string{"A=1", "B=2"}) ||
		req.MaxOutput != TaskMaxOutput || tk.defaultShell {
		t.Fatalf("%+v %v", tk, err)
	}
}

// TestParseScriptRuntime: flmexec's runtimes, trimmed; Python's "python"
// prefix of a version goes, shell's default is bash; the code runs as
// main.py or main.sh.
func TestParseScriptRuntime(t *testing.T) {
	for _, tc := range []struct {
		lang, runtime, session string
		interp, file           string
		defaultShell           bool
	}{
		{"python", "", "", "", "main.py", false},
		{"python", "3.11", "", "3.11", "main.py", false},
		{"python", " python3.11 ", "", "3.11", "main.py", false},
		{"python", "python3", "", "3", "main.py", false},
		{"python", "python", "", "", "main.py", false},
		{"python", "/usr/bin/python3", "", "/usr/bin/python3", "main.py", false},
		{"python", "pypy3", "", "pypy3", "main.py", false},
		{"python", "python3-dbg", "", "python3-dbg", "main.py", false},
		{"python", "", "python3.12", "3.12", "main.py", false}, // the session's (SandboxAttr.runtime)
		{"python", "3.11", "3.12", "3.11", "main.py", false},
		{"shell", "", "", "bash", "main.sh", true},
		{"shell", "  ", "", "bash", "main.sh", true},
		{"shell", "sh", "", "sh", "main.sh", false},
		{"shell", "/bin/sh", "", "/bin/sh", "main.sh", false},
		{"shell", "/usr/bin/zsh", "", "/usr/bin/zsh", "main.sh", false},
		{"shell", "", "bash", "bash", "main.sh", false},
	} {
		input := fmt.Sprintf(`{"language":%q,"runtime":%q,"code":"1","input":null}`, tc.lang, tc.runtime)
		tk, err := parseScript([]byte(input), taskDefaults{Timeout: time.Second, Runtime: tc.session})
		if err != nil || tk.req.Interpreter != tc.interp || tk.req.File != tc.file || tk.defaultShell != tc.defaultShell {
			t.Errorf("%s (session's %q): interpreter %q, file %q, default shell %v, want %q, %q, %v: %v",
				input, tc.session, tk.req.Interpreter, tk.req.File, tk.defaultShell, tc.interp, tc.file, tc.defaultShell, err)
		}
	}
	for _, bad := range []string{"3.11", "python3.x/", "bin/bash", "/bin/../bin/sh"} {
		if _, err := parseScript([]byte(`{"language":"shell","runtime":"`+bad+`","code":"1"}`), taskDefaults{Timeout: time.Second}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("shell runtime %q: %v", bad, err)
		}
	}
}

// TestParseScriptLargeShellCode: shell code runs from a file, so it may be
// as large as Python code (sh -c took at most 127 KiB).
func TestParseScriptLargeShellCode(t *testing.T) {
	code := "echo " + strings.Repeat("x", 500<<10)
	b, _ := json.Marshal(Script{Language: "shell", Code: code})
	if tk, err := parseScript(b, taskDefaults{Timeout: time.Second}); err != nil || tk.req.Code != code {
		t.Fatal(err)
	}
}

func TestSessionSpecBounds(t *testing.T) {
	s := New(nil, Options{Spec: sandbox.Spec{Image: "op", Network: sandbox.NetworkNone,
		Limits: sandbox.Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 256}}})
	sc := func(app, data string) *flamepb.SessionContext {
		c := &flamepb.SessionContext{SessionId: "s", Application: &flamepb.ApplicationContext{Name: "flmbox"}}
		if app != "" {
			c.Application.Image = &app
		}
		if data != "" {
			c.CommonData = []byte(data)
		}
		return c
	}
	spec, tasks, err := s.sessionSpec(sc("", ""))
	if err != nil || spec.Image != "op" || tasks.Timeout != DefaultTimeout || !spec.Ephemeral {
		t.Fatalf("%+v %+v %v", spec, tasks, err)
	}
	if spec, _, _ := s.sessionSpec(sc("app", "")); spec.Image != "app" {
		t.Errorf("the application's image: %q", spec.Image)
	}
	spec, tasks, err = s.sessionSpec(sc("app", `{"image":"mine","memory":"256MiB","cpus":0.5,"pids":64,"timeout":5,"env":["A=1"]}`))
	if err != nil || spec.Image != "mine" || spec.Limits.MemoryBytes != 256<<20 || spec.Limits.CPUs != 0.5 ||
		spec.Limits.Pids != 64 || tasks.Timeout != 5*time.Second || len(spec.Env) != 1 {
		t.Fatalf("%+v %+v %v", spec, tasks, err)
	}
	// flamepy.tools.Sandbox's exact common_data (json.dumps of its
	// SandboxAttr): its runtime is the tasks' default.
	for data, runtime := range map[string]string{
		`{"language": "python", "runtime": null, "min_instances": 0, "max_instances": null, "resreq": null}`:                            "",
		`{"language": "shell", "runtime": "bash", "min_instances": 1, "max_instances": 4, "resreq": {"cpu": 1, "memory": 2, "gpu": 0}}`: "bash",
	} {
		spec, tasks, err := s.sessionSpec(sc("", data))
		if err != nil || spec.Image != "op" || tasks.Runtime != runtime {
			t.Errorf("%s: %+v %+v %v", data, spec, tasks, err)
		}
		tk, err := parseScript([]byte(`{"language":"shell","code":"1","input":null}`), tasks)
		if err != nil || tk.runtime != runtime || tk.req.Interpreter != cmp.Or(runtime, "bash") {
			t.Errorf("%s: a task's runtime %q, interpreter %q, want %q: %v", data, tk.runtime, tk.req.Interpreter, runtime, err)
		}
	}
	if spec, _, err := s.sessionSpec(sc("", "not an object: Flame's own data")); err != nil || spec.Image != "op" {
		t.Errorf("common_data that is not an object: %+v %v", spec, err)
	}
	for _, data := range []string{`{"memory":"1GiB"}`, `{"cpus":2}`, `{"pids":1000}`, `{"network":"host"}`, `{"tmp_size":"1TiB"}`,
		`{"memory":"lots"}`, `{"unknown":1}`, `{"timeout":-1}`, `{"language":"ruby"}`} {
		if _, _, err := s.sessionSpec(sc("", data)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v", data, err)
		}
	}
	if _, _, err := New(nil, Options{}).sessionSpec(sc("", "")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no image anywhere: %v", err)
	}
}

// TestSessionTmpWithinMemory: /tmp is memory. A session that asks for less
// memory than the instance's /tmp gets a /tmp of its memory; one that asks
// for a /tmp larger than its memory is refused.
func TestSessionTmpWithinMemory(t *testing.T) {
	s := New(nil, Options{Spec: sandbox.Spec{Image: "op", Network: sandbox.NetworkNone,
		Limits: sandbox.Limits{MemoryBytes: 1 << 30, CPUs: 1, Pids: 256}, TmpBytes: 1 << 30}})
	sc := func(data string) *flamepb.SessionContext {
		return &flamepb.SessionContext{SessionId: "s", Application: &flamepb.ApplicationContext{Name: "flmbox"}, CommonData: []byte(data)}
	}
	spec, _, err := s.sessionSpec(sc(`{"memory":"512MiB"}`))
	if err != nil || spec.Limits.MemoryBytes != 512<<20 || spec.TmpBytes != 512<<20 {
		t.Errorf("less memory than the instance's /tmp: memory %d, /tmp %d, %v", spec.Limits.MemoryBytes, spec.TmpBytes, err)
	}
	spec, _, err = s.sessionSpec(sc(`{"memory":"512MiB","tmp_size":"256MiB"}`))
	if err != nil || spec.TmpBytes != 256<<20 {
		t.Errorf("a /tmp within memory: /tmp %d, %v", spec.TmpBytes, err)
	}
	if _, _, err := s.sessionSpec(sc(`{"memory":"512MiB","tmp_size":"768MiB"}`)); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "want at most memory") {
		t.Errorf("a /tmp larger than memory: %v", err)
	}
}

// TestSessionNetwork: a session may ask for less network than its
// operator's, never more: under egress, only within the operator's rules,
// whose denials and DNS servers stay.
func TestSessionNetwork(t *testing.T) {
	rule := func(s string) sandbox.EgressRule {
		r, err := sandbox.ParseEgressRule(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	op := func(n sandbox.Network, e sandbox.Egress) *Server {
		return New(nil, Options{Spec: sandbox.Spec{Image: "op", Network: n, Egress: e}})
	}
	sc := func(data string) *flamepb.SessionContext {
		return &flamepb.SessionContext{SessionId: "s", Application: &flamepb.ApplicationContext{Name: "flmbox"}, CommonData: []byte(data)}
	}
	eg := op(sandbox.NetworkEgress, sandbox.Egress{Allow: []sandbox.EgressRule{rule("*.example.com"), rule("pypi.org:443")},
		Deny: []sandbox.EgressRule{rule("bad.example.com")}})
	spec, _, err := eg.sessionSpec(sc(`{}`))
	if err != nil || spec.Network != sandbox.NetworkEgress || len(spec.Egress.Allow) != 2 || len(spec.Egress.Deny) != 1 {
		t.Fatalf("the operator's egress: %+v, %v", spec, err)
	}
	spec, _, err = eg.sessionSpec(sc(`{"allow":["api.example.com:443"],"deny":["pypi.org"]}`))
	if err != nil || len(spec.Egress.Allow) != 1 || spec.Egress.Allow[0].String() != "api.example.com:443" || len(spec.Egress.Deny) != 2 {
		t.Fatalf("a narrower egress: %+v, %v", spec.Egress, err)
	}
	spec, _, err = eg.sessionSpec(sc(`{"network":"none"}`))
	if err != nil || spec.Network != sandbox.NetworkNone || len(spec.Egress.Allow) != 0 {
		t.Fatalf("none under egress: %+v, %v", spec, err)
	}
	spec, _, err = op(sandbox.NetworkHost, sandbox.Egress{}).sessionSpec(sc(`{"network":"egress","allow":["pypi.org"]}`))
	if err != nil || spec.Network != sandbox.NetworkEgress || len(spec.Egress.Allow) != 1 {
		t.Fatalf("egress under host: %+v, %v", spec, err)
	}
	for _, tc := range []struct {
		s    *Server
		data string
	}{
		{eg, `{"allow":["evil.org"]}`},
		{eg, `{"allow":["pypi.org"]}`}, // every port: wider than :443
		{eg, `{"network":"host"}`},
		{eg, `{"allow":["not a rule"]}`},
		{op(sandbox.NetworkNone, sandbox.Egress{}), `{"network":"egress"}`},
		{op(sandbox.NetworkNone, sandbox.Egress{}), `{"allow":["pypi.org"]}`},
		{op(sandbox.NetworkHost, sandbox.Egress{}), `{"network":"host","allow":["pypi.org"]}`},
	} {
		if _, _, err := tc.s.sessionSpec(sc(tc.data)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s under %s: %v", tc.data, tc.s.o.Spec.Network, err)
		}
	}
}
