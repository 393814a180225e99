package instance

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/instance/flamepb"
	"github.com/flmbox/flmbox/sandbox"
)

// fakeSandboxes stand in for a sandbox.Manager: one sandbox, "sb", whose
// calls answer what run says.
type fakeSandboxes struct {
	run      func(req sandbox.Request) (*sandbox.Result, error)
	acquired int
	calls    []sandbox.Request
	released []string
}

func (f *fakeSandboxes) Acquire(_ context.Context, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	if spec.Image == "missing" {
		return nil, fmt.Errorf("pull %s: %w", spec.Image, errdefs.ErrNotFound)
	}
	f.acquired++
	return &sandbox.Sandbox{Name: "sb", Image: spec.Image}, nil
}

func (f *fakeSandboxes) Call(_ context.Context, name string, req sandbox.Request) (*sandbox.Result, error) {
	if name != "sb" {
		return nil, fmt.Errorf("sandbox %s: %w", name, errdefs.ErrNotFound)
	}
	f.calls = append(f.calls, req)
	if f.run != nil {
		return f.run(req)
	}
	return &sandbox.Result{Stdout: sandbox.Output{Data: []byte("ok\n"), Total: 3}}, nil
}

func (f *fakeSandboxes) Release(_ context.Context, name string) error {
	f.released = append(f.released, name)
	return nil
}

func enter(t *testing.T, s *Server, session, image string) *flamepb.Result {
	t.Helper()
	res, err := s.OnSessionEnter(context.Background(), &flamepb.SessionContext{SessionId: session,
		Application: &flamepb.ApplicationContext{Name: "flmexec", Image: &image}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func invoke(t *testing.T, s *Server, session, input string) *flamepb.TaskResult {
	t.Helper()
	res, err := s.OnTaskInvoke(context.Background(), &flamepb.TaskContext{TaskId: "1", SessionId: session, Input: []byte(input)})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func leave(t *testing.T, s *Server) *flamepb.Result {
	t.Helper()
	res, err := s.OnSessionLeave(context.Background(), &flamepb.EmptyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestTaskRequest: a task runs as flmexec runs it, as main.py or main.sh,
// under an hour's timeout by default.
func TestTaskRequest(t *testing.T) {
	f := &fakeSandboxes{}
	s := newServer(f, Options{})
	if res := enter(t, s, "s1", "img"); res.ReturnCode != 0 {
		t.Fatal(res.GetMessage())
	}
	for _, input := range []string{`{"language":"python","code":"print(1)","input":null}`, `{"language":"shell","code":"echo 1","input":null}`} {
		if res := invoke(t, s, "s1", input); res.ReturnCode != 0 || !bytes.HasPrefix(res.Output, []byte(`{"data":[111,107,10],`)) {
			t.Fatalf("%s: %d %q %s", input, res.ReturnCode, res.GetMessage(), res.Output)
		}
	}
	py, sh := f.calls[0], f.calls[1]
	if py.File != "main.py" || py.Interpreter != "" || py.Timeout != time.Hour || py.MaxOutput != TaskMaxOutput ||
		sh.File != "main.sh" || sh.Interpreter != "bash" || sh.Timeout != time.Hour {
		t.Fatalf("%+v\n%+v", py, sh)
	}
}

// TestTaskOfAnotherSession: a task that names another session than the
// one entered fails and runs nothing; one that names none runs.
func TestTaskOfAnotherSession(t *testing.T) {
	f := &fakeSandboxes{}
	s := newServer(f, Options{})
	enter(t, s, "s1", "img")
	script := `{"language":"shell","code":"touch /tmp/intruder","input":null}`
	res := invoke(t, s, "s2", script)
	if res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), `session "s2", not of "s1"`) || len(f.calls) != 0 {
		t.Fatalf("%d %q, %d calls", res.ReturnCode, res.GetMessage(), len(f.calls))
	}
	for _, session := range []string{"s1", ""} {
		if res := invoke(t, s, session, script); res.ReturnCode != 0 {
			t.Errorf("a task of session %q: %q", session, res.GetMessage())
		}
	}
}

// TestEnterTwice: a second enter is refused, whatever its session, and the
// session entered keeps its sandbox; a leave after a failed enter succeeds.
func TestEnterTwice(t *testing.T) {
	f := &fakeSandboxes{}
	s := newServer(f, Options{})
	if res := enter(t, s, "s1", "missing"); res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), "not found") {
		t.Fatalf("an enter that fails: %d %q", res.ReturnCode, res.GetMessage())
	}
	if res := invoke(t, s, "s1", `{"language":"python","code":"1","input":null}`); res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), "no session") {
		t.Fatalf("a task after a failed enter: %d %q", res.ReturnCode, res.GetMessage())
	}
	if res := leave(t, s); res.ReturnCode != 0 || len(f.released) != 0 { // Flame's unbinding after a failed enter
		t.Fatalf("a leave after a failed enter: %d %q", res.ReturnCode, res.GetMessage())
	}
	enter(t, s, "s1", "img")
	for _, session := range []string{"s2", "s1"} {
		if res := enter(t, s, session, "img"); res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), "entered already") {
			t.Errorf("a second enter, of %s: %d %q", session, res.ReturnCode, res.GetMessage())
		}
	}
	if res := invoke(t, s, "s1", `{"language":"python","code":"1","input":null}`); res.ReturnCode != 0 || f.acquired != 1 {
		t.Fatalf("a task after the second enter: %d %q, %d sandboxes", res.ReturnCode, res.GetMessage(), f.acquired)
	}
	if res := leave(t, s); res.ReturnCode != 0 || len(f.released) != 1 {
		t.Fatalf("leave: %d %q %v", res.ReturnCode, res.GetMessage(), f.released)
	}
}

// noBash is an image without bash, as the agent answers for it.
func noBash(req sandbox.Request) (*sandbox.Result, error) {
	if req.Interpreter == "bash" {
		return nil, &sandbox.NotRunError{Sandbox: "sb", NoInterpreter: true, Reason: `interpreter bash: the sandbox has none: find bash in PATH "/usr/bin:/bin": executable file not found in $PATH`}
	}
	return &sandbox.Result{Stdout: sandbox.Output{Data: []byte("ran\n"), Total: 4}}, nil
}

// TestDefaultShellWithoutBash: a shell task that names no shell runs with
// bash; in an image without bash, with its /bin/sh, found once a session.
// One that names bash fails, saying so.
func TestDefaultShellWithoutBash(t *testing.T) {
	f := &fakeSandboxes{run: noBash}
	s := newServer(f, Options{})
	enter(t, s, "s1", "img")
	shell := `{"language":"shell","code":"echo 1","input":null}`
	for i := range 2 {
		if res := invoke(t, s, "s1", shell); res.ReturnCode != 0 || !bytes.HasPrefix(res.Output, []byte(`{"data":[114,97,110,10],`)) {
			t.Fatalf("shell task %d: %d %q", i, res.ReturnCode, res.GetMessage())
		}
	}
	if len(f.calls) != 3 || f.calls[0].Interpreter != "bash" || f.calls[1].Interpreter != "" || f.calls[2].Interpreter != "" {
		t.Fatalf("calls: %+v", f.calls)
	}
	res := invoke(t, s, "s1", `{"language":"shell","runtime":"bash","code":"echo 1","input":null}`)
	if want := `runtime bash: the sandbox has none: find bash in PATH "/usr/bin:/bin": executable file not found in $PATH`; res.ReturnCode == 0 || res.GetMessage() != want {
		t.Fatalf("a task that names bash: %d %q, want %q", res.ReturnCode, res.GetMessage(), want)
	}
	// The next session's image may have bash.
	leave(t, s)
	enter(t, s, "s2", "img")
	f.calls, f.run = nil, nil
	if res := invoke(t, s, "s2", shell); res.ReturnCode != 0 || len(f.calls) != 1 || f.calls[0].Interpreter != "bash" {
		t.Fatalf("the next session: %d %q %+v", res.ReturnCode, res.GetMessage(), f.calls)
	}
}

// TestRuntimeMissing: a runtime the image lacks fails the task, in the
// task's words, naming the Pythons the image has; nothing is retried.
func TestRuntimeMissing(t *testing.T) {
	f := &fakeSandboxes{run: func(req sandbox.Request) (*sandbox.Result, error) {
		return nil, &sandbox.NotRunError{Sandbox: "sb", NoInterpreter: true, Reason: "interpreter " + req.Interpreter + ": the sandbox has no python3.12 in its PATH; it has python3, python3.11"}
	}}
	s := newServer(f, Options{})
	enter(t, s, "s1", "img")
	for runtime, want := range map[string]string{
		"3.12":         "runtime 3.12: the sandbox has no python3.12 in its PATH; it has python3, python3.11",
		" python3.12 ": "runtime python3.12: the sandbox has no python3.12 in its PATH; it has python3, python3.11",
	} {
		f.calls = nil
		res := invoke(t, s, "s1", `{"language":"python","runtime":"`+runtime+`","code":"1","input":null}`)
		if res.ReturnCode == 0 || res.GetMessage() != want || len(f.calls) != 1 {
			t.Errorf("runtime %q: %d %q, want %q (%d calls)", runtime, res.ReturnCode, res.GetMessage(), want, len(f.calls))
		}
	}
	f.run = func(sandbox.Request) (*sandbox.Result, error) {
		return nil, &sandbox.NotRunError{Sandbox: "sb", Reason: "write the code file: no space left on device"}
	}
	if res := invoke(t, s, "s1", `{"language":"python","code":"1","input":null}`); res.GetMessage() != "run the task: write the code file: no space left on device" {
		t.Errorf("another error: %q", res.GetMessage())
	}
}

// TestOutputLeavesRoomForTheInput: a task's output and its input fit in
// one gRPC message together, as Flame's client receives them.
func TestOutputLeavesRoomForTheInput(t *testing.T) {
	stdout := bytes.Repeat([]byte("text "), 600000)
	f := &fakeSandboxes{run: func(sandbox.Request) (*sandbox.Result, error) {
		return &sandbox.Result{Stdout: captured(stdout, TaskMaxOutput)}, nil
	}}
	s := newServer(f, Options{})
	enter(t, s, "s1", "img")
	input := `{"language":"python","code":"#` + strings.Repeat("x", 900<<10) + `","input":null}`
	res := invoke(t, s, "s1", input)
	d := decode(t, res.Output)
	if res.ReturnCode != 0 || len(res.Output)+len(input) > MaxMessage-messageSlack || len(res.Output) < 2<<20 || !d.StdoutTruncated || !bytes.HasPrefix(stdout, d.data()) {
		t.Fatalf("%d: %d bytes of output, %d of input, truncated %v", res.ReturnCode, len(res.Output), len(input), d.StdoutTruncated)
	}
}
