//go:build integration

package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/sandbox/record"
)

// TestInstanceTaskStdinEnvRuntime: a task's input bytes are its snippet's
// stdin, its env is its own, and its runtime picks one of the image's
// interpreters; one the image lacks fails the task, saying so.
func TestInstanceTaskStdinEnvRuntime(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	e := startInstance(t, root)
	if res := e.enter(t, "io", reg.digestRef(), `{"env":["FROM_SESSION=s"]}`); res.ReturnCode != 0 {
		t.Fatalf("enter: %d %s", res.ReturnCode, res.GetMessage())
	}
	task := func(fields map[string]any) (int32, string, taskOutput) {
		t.Helper()
		b, _ := json.Marshal(fields)
		res, out := e.task(t, "t", string(b))
		return res.ReturnCode, res.GetMessage(), out
	}
	// A Python that the image has under its full name: python3.N.
	_, _, out := task(map[string]any{"language": "shell", "code": `python3 -c 'import sys; print("python3.%d" % sys.version_info[1])'`})
	python3N := strings.TrimSpace(out.stdout())
	bytesOf := func(s string) []int {
		var ns []int
		for _, c := range []byte(s) {
			ns = append(ns, int(c))
		}
		return ns
	}
	for _, tc := range []struct {
		name   string
		fields map[string]any
		want   string
	}{
		{"python stdin", map[string]any{"language": "python", "code": "import sys\nfor line in sys.stdin: print(line.strip().upper())", "input": bytesOf("a\nb\n")}, "A\nB\n"},
		{"shell stdin, binary", map[string]any{"language": "shell", "code": "od -An -tu1 | tr -s ' '", "input": []int{0, 255, 10}}, " 0 255 10\n"},
		{"no stdin", map[string]any{"language": "shell", "code": "cat; echo eof", "input": nil}, "eof\n"},
		{"env", map[string]any{"language": "python", "code": "import os; print(os.environ['FROM_SESSION'], os.environ['FROM_TASK'])", "env": map[string]string{"FROM_TASK": "t"}}, "s t\n"},
		{"env is the task's only", map[string]any{"language": "shell", "code": "echo \"[$FROM_TASK]\""}, "[]\n"},
		{"runtime bash", map[string]any{"language": "shell", "runtime": "bash", "code": "echo ${BASH_VERSION:+bash} $((6*7))"}, "bash 42\n"},
		{"runtime " + python3N, map[string]any{"language": "python", "runtime": python3N, "code": "import sys; print('python3.%d' % sys.version_info[1], sys.stdin.read())", "input": bytesOf("in")}, python3N + " in\n"},
		{"runtime sh", map[string]any{"language": "shell", "runtime": "sh", "code": "echo \"${0##*/}\""}, "main.sh\n"}, // run as a file, as flmexec does
	} {
		code, msg, out := task(tc.fields)
		if code != 0 || out.ExitCode != 0 || out.stdout() != tc.want {
			t.Errorf("%s: return code %d %q, exit %d, stdout %q, want %q; stderr %q", tc.name, code, msg, out.ExitCode, out.stdout(), tc.want, out.Stderr)
		}
	}
	code, msg, _ := task(map[string]any{"language": "python", "runtime": "python2.1", "code": "print 1"})
	if code == 0 || !strings.HasPrefix(msg, "runtime python2.1: the sandbox has") {
		t.Errorf("a runtime the image lacks: return code %d, message %q", code, msg)
	}
	if code, msg, _ := task(map[string]any{"language": "python", "runtime": "../bin/python3", "code": "1"}); code == 0 || !strings.Contains(msg, "want a command name") {
		t.Errorf("a runtime that is a path: return code %d, message %q", code, msg)
	}
	// The session goes on.
	if code, _, out := task(map[string]any{"language": "python", "code": "print(1)"}); code != 0 || out.stdout() != "1\n" {
		t.Errorf("a task after refusals: %d %+v", code, out)
	}
}

// TestInstanceFlamepySandbox: a session as flamepy.tools.Sandbox opens it,
// with its SandboxAttr as common_data, whose runtime its tasks take.
func TestInstanceFlamepySandbox(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	e := startInstance(t, root, "--image", reg.digestRef())
	attr := `{"language": "shell", "runtime": "bash", "min_instances": 0, "max_instances": null, "resreq": null}`
	if res := e.enter(t, "flamepy", "", attr); res.ReturnCode != 0 {
		t.Fatalf("enter with flamepy's common_data: %d %s", res.ReturnCode, res.GetMessage())
	}
	// flamepy's run_code(code, input=b"x"): {"language", "code", "input", "runtime"}.
	res, out := e.task(t, "t", `{"language": "shell", "code": "echo ${BASH_VERSION:+bash}; cat", "input": [120], "runtime": "bash"}`)
	if res.ReturnCode != 0 || out.stdout() != "bash\nx" {
		t.Fatalf("task: %d %q %+v", res.ReturnCode, res.GetMessage(), out)
	}
	// A task without a runtime takes the session's.
	if res, out := e.task(t, "t", `{"language": "shell", "code": "echo ${BASH_VERSION:+bash}", "input": null}`); res.ReturnCode != 0 || out.stdout() != "bash\n" {
		t.Fatalf("task without a runtime: %d %q %+v", res.ReturnCode, res.GetMessage(), out)
	}
}

// TestInstanceKilled: an instance SIGKILLed with its session entered cannot
// leave it; the next flmbox command removes its sandbox (its owner is gone)
// and leaves no container and no lease.
func TestInstanceKilled(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	e := startInstance(t, root)
	if res := e.enter(t, "killed", reg.digestRef(), ""); res.ReturnCode != 0 {
		t.Fatalf("enter: %d %s", res.ReturnCode, res.GetMessage())
	}
	if res, out := e.task(t, "t", script("shell", "echo kept > /tmp/f; cat /tmp/f")); res.ReturnCode != 0 || out.stdout() != "kept\n" {
		t.Fatalf("task: %d %q %+v", res.ReturnCode, res.GetMessage(), out)
	}
	var rec *record.Record
	for name := range sandboxNames(t, root) {
		r, err := record.Read(root, name)
		if err != nil {
			t.Fatal(err)
		}
		rec = r
	}
	if rec == nil || rec.Owner == nil || rec.Owner.PID != e.sim.Pid() {
		t.Fatalf("the session's sandbox %+v: want one owned by the instance (pid %d)", rec, e.sim.Pid())
	}
	e.sim.Kill() // its process group, reaped
	ownerCleaned(t, root, rec)
}

// TestInstanceEnterRefused: a session that cannot have its sandbox (no
// image, more than the instance allows, an image the registry lacks) is
// refused with a message saying what to fix, leaves nothing behind, and the
// instance takes the next session.
func TestInstanceEnterRefused(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	e := startInstance(t, root, "--memory", "512MiB")
	ref := reg.digestRef()
	at := strings.LastIndex(ref, "@sha256:")
	missing := ref[:at] + "@sha256:" + strings.Repeat("0", 64)
	for _, tc := range []struct{ image, data, want string }{
		{"", "", "no image: the session's common_data, the application or flmbox instance --image must name one"},
		{ref, `{"memory":"1GiB"}`, "memory 1073741824 bytes: want more than 0 and at most 536870912"},
		{ref, `{"network":"host"}`, "network host: this instance allows at most none"},
		{ref, `{"image":7}`, "common_data"},
		{missing, "", "sha256:" + strings.Repeat("0", 64)},
	} {
		res := e.enter(t, "refused", tc.image, tc.data)
		t.Logf("refused: %s", res.GetMessage())
		if res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), tc.want) {
			t.Errorf("enter with image %q, common_data %q: %d %q, want a message with %q", tc.image, tc.data, res.ReturnCode, res.GetMessage(), tc.want)
		}
		if names := sandboxNames(t, root); len(names) != 0 {
			t.Fatalf("a refused session left sandboxes: %v", names)
		}
		if ls := leases(t, root); len(ls) != 0 {
			t.Fatalf("a refused session left image leases: %+v", ls)
		}
	}
	if res := e.enter(t, "ok", ref, ""); res.ReturnCode != 0 {
		t.Fatalf("enter after refusals: %d %s", res.ReturnCode, res.GetMessage())
	}
	if res, out := e.task(t, "t", script("python", "print(1)")); res.ReturnCode != 0 || out.stdout() != "1\n" {
		t.Fatalf("task: %d %q %+v", res.ReturnCode, res.GetMessage(), out)
	}
}
