//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flmbox/flmbox/instance/flamepb"
	"github.com/flmbox/flmbox/internal/testrig/flamesim"
)

// flameExecutor does what Flame's executor manager does with an application,
// through package flamesim: it starts flmbox instance in a working directory
// of its own with FLAME_INSTANCE_ENDPOINT naming a socket there, in a process
// group of its own, waits for the socket, and connects.
type flameExecutor struct {
	sim    *flamesim.Executor
	stderr *syncBuffer // the instance's
	client flamepb.InstanceClient
}

// syncBuffer is a bytes.Buffer that a process's output can be written to
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startInstance(t *testing.T, root string, args ...string) *flameExecutor {
	t.Helper()
	e := &flameExecutor{stderr: &syncBuffer{}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sim, err := flamesim.Start(ctx, flmboxBin, append([]string{"--root", root, "--runsc", runscPath, "instance"}, args...),
		flamesim.Options{Dir: t.TempDir(), Stderr: e.stderr})
	if err != nil {
		t.Fatalf("flmbox instance made no socket within a minute: %v\n%s", err, e.stderr)
	}
	t.Cleanup(sim.Kill)
	e.sim, e.client = sim, sim.Client()
	return e
}

func (e *flameExecutor) enter(t *testing.T, session, image, commonData string) *flamepb.Result {
	t.Helper()
	var data []byte
	if commonData != "" {
		data = []byte(commonData)
	}
	res, err := e.sim.Enter(context.Background(), session, image, data)
	if err != nil {
		t.Fatalf("%v\n%s", err, e.stderr)
	}
	return res
}

// taskOutput is a task's output as flmbox instance writes it.
type taskOutput struct{ flamesim.Output }

// stdout is bytes(data), as flamepy decodes it.
func (o taskOutput) stdout() string { return string(o.Data) }

func (e *flameExecutor) task(t *testing.T, id, input string) (*flamepb.TaskResult, taskOutput) {
	t.Helper()
	res, err := e.sim.Invoke(context.Background(), id, []byte(input))
	if err != nil {
		t.Fatalf("%v\n%s", err, e.stderr)
	}
	var out taskOutput
	if res.ReturnCode == 0 {
		o, err := flamesim.DecodeOutput(res)
		if err != nil {
			t.Fatalf("task %s: %v", id, err)
		}
		out.Output = *o
	}
	return res, out
}

func script(lang, code string) string { return string(flamesim.Script(lang, code)) }

// TestInstanceOverFlameProtocol runs demo 1 as three tasks of one session
// through the Instance protocol, with flamepy's exact request, a timeout,
// refusals, and a SIGTERM that leaves nothing behind.
func TestInstanceOverFlameProtocol(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	e := startInstance(t, root)
	if res := e.enter(t, "s1", reg.digestRef(), ""); res.ReturnCode != 0 {
		t.Fatalf("enter: %d %s\n%s", res.ReturnCode, res.GetMessage(), e.stderr)
	}
	if res := e.enter(t, "s2", reg.digestRef(), ""); res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), "entered already") {
		t.Errorf("a second enter: %d %q", res.ReturnCode, res.GetMessage())
	}
	demo1, err := os.ReadFile("../demo/demo1.py")
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ input, want string }{
		{script("shell", `mkdir -p /tmp/demo && printf "region,revenue,cost\neast,120,75\nwest,80,55\neast,150,90\nwest,100,70\n" > /tmp/demo/sales.csv`), ""},
		{script("python", string(demo1)), "{\"rows\": 4, \"revenue\": 450, \"profit\": 160}\nLinux\n"},
		{script("SHELL", "cat /tmp/demo/summary.json"), `{"rows": 4, "revenue": 450, "profit": 160}`},
		// flamepy.tools.Sandbox's exact bytes (Python's json.dumps), and
		// compact JSON.
		{`{"language": "python", "code": "print(1)", "input": null}`, "1\n"},
		{`{"language":"python","code":"print(1)","input":null}`, "1\n"},
	} {
		res, out := e.task(t, "t", tc.input)
		if res.ReturnCode != 0 || out.ExitCode != 0 || out.stdout() != tc.want || out.Stdout != tc.want {
			t.Fatalf("task %d: %d %q %+v", i, res.ReturnCode, res.GetMessage(), out)
		}
	}
	// A snippet that fails is a task that ran: return code 0, its exit code.
	if res, out := e.task(t, "t", script("python", "import sys; print('x', file=sys.stderr); sys.exit(3)")); res.ReturnCode != 0 || out.ExitCode != 3 || out.Stderr != "x\n" {
		t.Errorf("a failing snippet: %d %+v", res.ReturnCode, out)
	}
	if res, out := e.task(t, "t", `{"language":"python","code":"while True: pass","input":null,"timeout":1}`); res.ReturnCode != 0 || !out.TimedOut {
		t.Errorf("a snippet that times out: %d %q %+v", res.ReturnCode, res.GetMessage(), out)
	}
	if res, out := e.task(t, "t", script("python", "print(2)")); res.ReturnCode != 0 || out.stdout() != "2\n" {
		t.Errorf("the task after a timeout: %d %+v", res.ReturnCode, out)
	}
	for _, bad := range []string{script("ruby", "puts 1"), "not json", `{"language":"python","code":"1","input":[256]}`, `{"language":"python","code":"1","runtime":"python2.1"}`} {
		if res, _ := e.task(t, "t", bad); res.ReturnCode == 0 || res.GetMessage() == "" {
			t.Errorf("%s: return code %d, message %q", bad, res.ReturnCode, res.GetMessage())
		}
	}
	if res, err := e.client.OnSessionLeave(context.Background(), &flamepb.EmptyRequest{}); err != nil || res.ReturnCode != 0 {
		t.Fatalf("leave: %v %v", res, err)
	}
	if names := sandboxNames(t, root); len(names) != 0 {
		t.Fatalf("sandboxes left after the leave: %v", names)
	}
	// A new session, then SIGTERM as Flame stops an executor: the session
	// is left, the process exits 0.
	if res := e.enter(t, "s3", "", `{"image":"`+reg.digestRef()+`","memory":"256MiB"}`); res.ReturnCode != 0 {
		t.Fatalf("enter with common_data: %d %s", res.ReturnCode, res.GetMessage())
	}
	var wg sync.WaitGroup
	wg.Go(func() { // running when SIGTERM comes: it fails (the server stops), or is answered interrupted
		e.client.OnTaskInvoke(context.Background(), &flamepb.TaskContext{TaskId: "t", SessionId: "s3",
			Input: []byte(script("shell", "touch /tmp/started; sleep 100"))})
	})
	var name string
	for n := range sandboxNames(t, root) {
		name = n
	}
	for deadline := time.Now().Add(time.Minute); runIn(t, root, name, "test -e /tmp/started", "-l", "shell").code != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the task did not start within a minute")
		}
	}
	if err := e.sim.Stop(time.Minute); err != nil {
		t.Fatalf("flmbox instance after SIGTERM: %v\n%s", err, e.stderr)
	}
	wg.Wait()
	if names := sandboxNames(t, root); len(names) != 0 {
		t.Fatalf("sandboxes left after SIGTERM: %v", names)
	}
	if !strings.Contains(e.stderr.String(), `flmbox instance: enter session "s1"`) {
		t.Errorf("no log line per call:\n%s", e.stderr)
	}
}

// TestInstanceDemo2OverTwoExecutors runs demo 2's four snippets as tasks of
// one session spread over two instance processes at once, as Flame spreads a
// session's tasks over executors: each result matches its input.
func TestInstanceDemo2OverTwoExecutors(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	var demo struct{ Codes []string }
	b, err := os.ReadFile("../demo/demo2.json")
	if err != nil || json.Unmarshal(b, &demo) != nil || len(demo.Codes) != 4 {
		t.Fatalf("demo/demo2.json: %v", err)
	}
	want := []string{"450.0 160.0\n", "405.0 115.0\n", "360.0 70.0\n", ""}
	executors := []*flameExecutor{startInstance(t, root), startInstance(t, root)}
	for _, e := range executors {
		if res := e.enter(t, "demo2", reg.digestRef(), ""); res.ReturnCode != 0 {
			t.Fatalf("enter: %d %s", res.ReturnCode, res.GetMessage())
		}
	}
	outs := make([]taskOutput, len(demo.Codes))
	codes := make([]int32, len(demo.Codes))
	var wg sync.WaitGroup
	for i, e := range executors { // tasks one at a time per executor, both at once
		wg.Go(func() {
			for j := i; j < len(demo.Codes); j += len(executors) {
				res, err := e.client.OnTaskInvoke(context.Background(), &flamepb.TaskContext{TaskId: fmt.Sprint(j), SessionId: "demo2",
					Input: []byte(script("python", demo.Codes[j]))})
				if err != nil {
					t.Errorf("task %d: %v", j, err)
					continue
				}
				codes[j] = res.ReturnCode
				json.Unmarshal(res.GetOutput(), &outs[j])
			}
		})
	}
	wg.Wait()
	for j := range demo.Codes {
		if codes[j] != 0 || outs[j].stdout() != want[j] {
			t.Errorf("task %d: return code %d, stdout %q, want %q", j, codes[j], outs[j].stdout(), want[j])
		}
	}
	if outs[3].ExitCode != 1 || !strings.Contains(outs[3].Stderr, "ValueError: discount must be between 0 and 1") {
		t.Errorf("task 3: %+v", outs[3])
	}
	for _, e := range executors {
		if res, err := e.client.OnSessionLeave(context.Background(), &flamepb.EmptyRequest{}); err != nil || res.ReturnCode != 0 {
			t.Fatalf("leave: %v %v", res, err)
		}
	}
	if names := sandboxNames(t, root); len(names) != 0 {
		t.Fatalf("sandboxes left: %v", names)
	}
}

// TestInstanceSandboxDies: once the session's sandbox is dead, the task
// running and every later one fail at once, saying so, and the leave still
// cleans up. (A snippet cannot kill its agent, which runs as another user:
// hostile_test.go; the host kills it here.)
func TestInstanceSandboxDies(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	e := startInstance(t, root)
	if res := e.enter(t, "dies", reg.digestRef(), ""); res.ReturnCode != 0 {
		t.Fatalf("enter: %d %s", res.ReturnCode, res.GetMessage())
	}
	var name string
	for n := range sandboxNames(t, root) {
		name = n
	}
	// A task runs when the sandbox dies: it fails, saying why.
	running := make(chan *flamepb.TaskResult, 1)
	go func() {
		res, _ := e.client.OnTaskInvoke(context.Background(), &flamepb.TaskContext{TaskId: "running", SessionId: "dies",
			Input: []byte(script("shell", "touch /tmp/started; sleep 100"))})
		running <- res
	}()
	for deadline := time.Now().Add(time.Minute); runIn(t, root, name, "test -e /tmp/started", "-l", "shell").code != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the task did not start within a minute")
		}
	}
	runscOn(t, root, "kill", sandboxID(t, root, name), "SIGKILL") // its agent, and so its gVisor sandbox
	select {
	case res := <-running:
		if res == nil || res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), "dead") {
			t.Fatalf("the task running when the sandbox died: %v", res)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the task running when the sandbox died has no answer within two minutes")
	}
	for i := range 2 {
		res, _ := e.task(t, "t", script("python", "print(1)"))
		if res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), "dead") {
			t.Fatalf("task %d after the sandbox died: %d %q", i, res.ReturnCode, res.GetMessage())
		}
	}
	if res, err := e.client.OnSessionLeave(context.Background(), &flamepb.EmptyRequest{}); err != nil || res.ReturnCode != 0 {
		t.Fatalf("leave: %v %v", res, err)
	}
	if names := sandboxNames(t, root); len(names) != 0 {
		t.Fatalf("sandboxes left: %v", names)
	}
}
