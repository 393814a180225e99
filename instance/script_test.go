package instance

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/instance/flamepb"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/snippet/wire"
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
		if err != nil || req.Language != tc.lang || req.Timeout != tc.time {
			t.Errorf("%s: %+v %v", tc.input, req, err)
		}
	}
}

func TestParseScriptStdinEnvRuntime(t *testing.T) {
	req, err := parseScript([]byte(`{"language":"shell","runtime":"bash","code":"cat","input":[104,105],"env":{"B":"2","A":"1"}}`), taskDefaults{Timeout: time.Second})
	if err != nil || string(req.Stdin) != "hi" || req.Interpreter != "bash" || !slices.Equal(req.Env, []string{"A=1", "B=2"}) ||
		req.MaxOutput != TaskMaxOutput {
		t.Fatalf("%+v %v", req, err)
	}
}

// TestOutputFitsInAGRPCMessage: whatever a snippet prints, its task's
// output is under gRPC's default 4 MiB.
func TestOutputFitsInAGRPCMessage(t *testing.T) {
	worst := bytes.Repeat([]byte{1}, TaskMaxOutput+200) // a control character: \u0001 in a JSON string
	res := &wire.Result{Stdout: wire.Output{Data: worst, Truncated: true}, Stderr: wire.Output{Data: worst, Truncated: true}}
	b, err := json.Marshal(newOutput(res))
	if err != nil || len(b) >= 4<<20 {
		t.Fatalf("%d bytes, want under %d: %v", len(b), 4<<20, err)
	}
	worst = bytes.Repeat([]byte{255}, TaskMaxOutput+200) // "255," in data
	res.Stdout.Data = worst
	if b, err = json.Marshal(newOutput(res)); err != nil || len(b) >= 4<<20 {
		t.Fatalf("%d bytes, want under %d: %v", len(b), 4<<20, err)
	}
}

func TestOutputDataIsAnArrayOfNumbers(t *testing.T) {
	b, err := json.Marshal(Output{Data: Bytes("hi\xff")})
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Data []int }
	if err := json.Unmarshal(b, &v); err != nil || len(v.Data) != 3 || v.Data[0] != 'h' || v.Data[2] != 255 {
		t.Fatalf("%s: %v %v", b, v, err)
	}
}

func TestSessionSpecBounds(t *testing.T) {
	s := New(nil, Options{Spec: sandbox.Spec{Image: "op", Network: runtime.NetworkNone,
		Limits: runtime.Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 256}}})
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
	if err != nil || spec.Image != "op" || tasks.Timeout != sandbox.DefaultTimeout || !spec.Ephemeral {
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
		req, err := parseScript([]byte(`{"language":"shell","code":"1","input":null}`), tasks)
		if err != nil || req.Interpreter != runtime {
			t.Errorf("%s: a task's interpreter %q, want %q: %v", data, req.Interpreter, runtime, err)
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
