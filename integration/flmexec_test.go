//go:build integration

package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/instance/flamepb"
	"github.com/flmbox/flmbox/internal/testrig/flamesim"
)

// flamepyTask is a task's input as flamepy.tools.Sandbox sends it for a
// Sandbox of language and runtime ("": None).
func flamepyTask(language, runtime, code string) string {
	return string(flamesim.Task{Language: language, Runtime: runtime, Code: code}.JSON())
}

// TestInstanceFlmexec: flmbox instance keeps flmexec's contract, as
// flamepy's Sandbox and what was written for flmexec use it: the output's
// data is stdout byte for byte, or its longest prefix that one gRPC message
// carries, saying so; runtime takes flmexec's forms and the default shell is
// bash; code runs as main.py or main.sh; a task of another session runs
// nothing; and a task may run longer than 30 s.
func TestInstanceFlmexec(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)

	// flmexec has no timeout; flmbox's default is an hour (it was 30 s).
	// On an instance of its own. (The cases run one after the other, in
	// this test's turn: parallel subtests wait behind every other test.)
	t.Run("default timeout", func(t *testing.T) {
		e := startInstance(t, root)
		// Flame leaves a session whose enter failed: that succeeds.
		if res := e.enter(t, "bad", reg.digestRef(), `{"memory": "lots"}`); res.ReturnCode == 0 {
			t.Fatal("an enter with bad common_data succeeded")
		}
		if res, err := e.sim.Leave(context.Background()); err != nil || res.ReturnCode != 0 {
			t.Fatalf("the leave after a failed enter: %v %v", res, err)
		}
		if res := e.enter(t, "long", reg.digestRef(), ""); res.ReturnCode != 0 {
			t.Fatalf("enter: %d %s\n%s", res.ReturnCode, res.GetMessage(), e.stderr)
		}
		res, out := e.task(t, "long", flamepyTask("shell", "", "sleep 31; echo done"))
		if res.ReturnCode != 0 || out.TimedOut || out.ExitCode != 0 || out.stdout() != "done\n" {
			t.Fatalf("a task of 31 s: %d %q %+v", res.ReturnCode, res.GetMessage(), out)
		}
	})

	t.Run("contract", func(t *testing.T) {
		e := startInstance(t, root)
		if res := e.enter(t, "s1", reg.digestRef(), `{"language": "python", "runtime": null, "min_instances": 0, "max_instances": null, "resreq": null}`); res.ReturnCode != 0 {
			t.Fatalf("enter: %d %s\n%s", res.ReturnCode, res.GetMessage(), e.stderr)
		}
		task := func(language, runtime, code string) (*flamepb.TaskResult, taskOutput) {
			t.Helper()
			return e.task(t, "t", flamepyTask(language, runtime, code))
		}

		// Output. 700 KB of text fits whole (it was cut at 100 KiB).
		var text bytes.Buffer
		for i := range 70000 {
			fmt.Fprintf(&text, "%09d\n", i)
		}
		res, out := task("python", "", `print('\n'.join('%09d' % i for i in range(70000)))`)
		if res.ReturnCode != 0 || !bytes.Equal(out.Data, text.Bytes()) || out.StdoutTruncated || out.StdoutBytes != int64(text.Len()) {
			t.Errorf("700 KB of text: %d %q, %d bytes of data of %d, truncated %v, stdout_bytes %d",
				res.ReturnCode, res.GetMessage(), len(out.Data), text.Len(), out.StdoutTruncated, out.StdoutBytes)
		}
		// 5 MiB of every byte value: over what one gRPC message carries.
		// data is its longest prefix that fits, exactly its bytes.
		stream := bytes.Repeat(func() []byte {
			b := make([]byte, 256)
			for i := range b {
				b[i] = byte(i)
			}
			return b
		}(), 20480)
		res, out = task("python", "", "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 20480)")
		tail := strings.ToValidUTF8(string(stream[len(stream)-16<<10:]), "\uFFFD")
		if res.ReturnCode != 0 || len(res.Output) > 4<<20 || len(out.Data) < 300<<10 || !bytes.HasPrefix(stream, out.Data) ||
			!out.StdoutTruncated || out.StdoutBytes != int64(len(stream)) || out.StdoutTail != tail {
			t.Errorf("5 MiB of bytes: %d %q, %d bytes of output, %d bytes of data, a prefix: %v, truncated %v, stdout_bytes %d, tail right: %v",
				res.ReturnCode, res.GetMessage(), len(res.Output), len(out.Data), bytes.HasPrefix(stream, out.Data),
				out.StdoutTruncated, out.StdoutBytes, out.StdoutTail == tail)
		}

		// Python runtimes, in flmexec's forms; the test image's Python is
		// Debian's 3.11.
		version := "import sys\nprint('%d.%d' % sys.version_info[:2])"
		for _, runtime := range []string{"3.11", " python3.11 ", "python3", "/usr/bin/python3", "/usr/bin/python3.11"} {
			if res, out := task("python", runtime, version); res.ReturnCode != 0 || out.stdout() != "3.11\n" {
				t.Errorf("runtime %q: %d %q, stdout %q, stderr %q", runtime, res.ReturnCode, res.GetMessage(), out.stdout(), out.Stderr)
			}
		}
		for _, runtime := range []string{"3.12", "python3.12"} {
			res, _ := task("python", runtime, "print(1)")
			if msg := res.GetMessage(); res.ReturnCode == 0 || !strings.HasPrefix(msg, "runtime "+runtime+": ") || !strings.Contains(msg, "python3.11") {
				t.Errorf("runtime %s: %d %q, want a failed task naming the image's Pythons", runtime, res.ReturnCode, msg)
			}
		}

		// Shells: bash by default, as in flmexec; the code is main.sh ($0).
		probe := `echo "${BASH_VERSION:+bash}:$0"`
		for runtime, shell := range map[string]string{"": "bash", "bash": "bash", "/bin/bash": "bash", "sh": "", "/bin/sh": ""} {
			res, out := task("shell", runtime, probe)
			if res.ReturnCode != 0 || !strings.HasPrefix(out.stdout(), shell+":/") || !strings.HasSuffix(out.stdout(), "/main.sh\n") {
				t.Errorf("shell runtime %q: %d %q, stdout %q, want %q, then $0 .../main.sh", runtime, res.ReturnCode, res.GetMessage(), out.stdout(), shell+":")
			}
		}

		// Python code is main.py: __file__, sys.argv[0], and the file
		// holds the code.
		code := "import sys\nprint(__file__ == sys.argv[0], __file__.endswith('/main.py'))\nsys.stdout.write(open(__file__).read())\n"
		if res, out := task("python", "", code); res.ReturnCode != 0 || out.stdout() != "True True\n"+code {
			t.Errorf("main.py: %d %q, stdout %q, stderr %q", res.ReturnCode, res.GetMessage(), out.stdout(), out.Stderr)
		}

		// A task of another session fails and runs nothing.
		res, err := e.client.OnTaskInvoke(context.Background(), &flamepb.TaskContext{TaskId: "x", SessionId: "s2",
			Input: []byte(flamepyTask("shell", "", "touch /tmp/intruder"))})
		if err != nil || res.ReturnCode == 0 || !strings.Contains(res.GetMessage(), "another session") {
			t.Errorf("a task of another session: %v %v", res, err)
		}
		if res, out := task("shell", "", "test -e /tmp/intruder && echo present || echo absent"); res.ReturnCode != 0 || out.stdout() != "absent\n" {
			t.Errorf("the task of another session ran: %d %q %q", res.ReturnCode, res.GetMessage(), out.stdout())
		}
	})
}
