package snippet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/testrig/testprog"
	"github.com/flmbox/flmbox/snippet/wire"
)

// guard bounds every call in these tests: a call that takes longer hangs.
const guard = 10 * time.Second

// hostPython returns the host's python3, preferring the system one (a
// version manager's shim on PATH is a shell script, slower to start).
func hostPython(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("these tests need python3 on the host: %v", err)
	}
	return p
}

// withSpares says whether t runs under TestSpares, which runs the tests of
// Run again with agents that have spares and a running zygote. It is the
// test's name, not a package variable, so that those tests run in parallel
// with and without spares.
func withSpares(t testing.TB) bool {
	return strings.HasPrefix(t.Name(), "TestSpares/")
}

// testAgent returns an agent that runs snippets in a fresh directory, with
// spares and a running zygote under TestSpares.
func testAgent(t testing.TB) *Agent {
	t.Helper()
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: withSpares(t)}
	if a.Spares {
		warmUp(t, a)
	}
	return a
}

func request(lang, code string, edits ...func(*wire.Request)) *wire.Request {
	r := &wire.Request{Version: wire.ProtocolVersion, Language: lang, Code: code, TimeoutMS: guard.Milliseconds()}
	for _, e := range edits {
		e(r)
	}
	return r
}

// run runs a request and fails the test if it does not return within its
// timeout and guard more: then it hangs.
func run(t *testing.T, a *Agent, req *wire.Request) *wire.Result {
	t.Helper()
	return runCtx(t, context.Background(), a, req)
}

// runCtx is run with ctx.
func runCtx(t *testing.T, ctx context.Context, a *Agent, req *wire.Request) *wire.Result {
	t.Helper()
	done := make(chan *wire.Result, 1)
	go func() { done <- a.Run(ctx, req) }()
	limit := time.Duration(req.TimeoutMS)*time.Millisecond + guard
	select {
	case res := <-done:
		return res
	case <-time.After(limit):
		t.Fatalf("Run of %q did not return within %s", req.Code, limit)
		return nil
	}
}

func dump(res *wire.Result) string {
	return fmt.Sprintf("exit %d signal %q timed out %v error %q\nstdout: %q\nstderr: %q",
		res.ExitCode, res.Signal, res.TimedOut, res.Error, res.Stdout.Data, res.Stderr.Data)
}

func TestRunPrints(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	for _, tc := range []struct {
		name, lang, code, stdout, stderr string
	}{
		{"python", wire.LanguagePython, "import sys\nprint('hello')\nprint('oops', file=sys.stderr)", "hello\n", "oops\n"},
		{"shell", wire.LanguageShell, "echo hello; echo oops >&2", "hello\n", "oops\n"},
		{"python empty", wire.LanguagePython, "", "", ""},
		{"shell empty", wire.LanguageShell, "", "", ""},
		{"python unicode", wire.LanguagePython, "print('héllo ✓')", "héllo ✓\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(tc.lang, tc.code))
			if res.ExitCode != 0 || string(res.Stdout.Data) != tc.stdout || string(res.Stderr.Data) != tc.stderr ||
				res.Stdout.Total != int64(len(tc.stdout)) || res.Stdout.Truncated || res.TimedOut || res.Error != "" {
				t.Fatalf("got %s", dump(res))
			}
			if res.Version != wire.ProtocolVersion || res.DurationMS <= 0 {
				t.Fatalf("version %d duration %v", res.Version, res.DurationMS)
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	for _, tc := range []struct {
		name, lang, code string
		exit             int
		signal           string
	}{
		{"python sys.exit(3)", wire.LanguagePython, "import sys\nsys.exit(3)", 3, ""},
		{"python exception", wire.LanguagePython, "raise ValueError('x')", 1, ""},
		{"python sys.exit(message)", wire.LanguagePython, "import sys; sys.exit('bye')", 1, ""},
		{"python KeyboardInterrupt", wire.LanguagePython, "raise KeyboardInterrupt", 130, "SIGINT"},
		{"python killed by a signal", wire.LanguagePython, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", 143, "SIGTERM"},
		{"shell exit 7", wire.LanguageShell, "exit 7", 7, ""},
		{"shell false", wire.LanguageShell, "false", 1, ""},
		{"shell command not found", wire.LanguageShell, "nosuchcommand-flmbox", 127, ""},
		{"shell kills itself", wire.LanguageShell, "kill -KILL $$", 137, "SIGKILL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(tc.lang, tc.code))
			if res.ExitCode != tc.exit || res.Signal != tc.signal || res.TimedOut || res.Error != "" {
				t.Fatalf("want exit %d signal %q, got %s", tc.exit, tc.signal, dump(res))
			}
		})
	}
}

func TestRunPythonTraceback(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	for _, tc := range []struct {
		name, code string
		want       []string
	}{
		{"uncaught", "x = 1\ny = 0\nprint(x / y)\n", []string{
			"Traceback (most recent call last):\n  File \"<snippet>\", line 3, in <module>\n    print(x / y)\n",
			"ZeroDivisionError: division by zero\n"}},
		{"in a function", "def f(n):\n    return {}[n]\n\nf('key')\n", []string{
			"  File \"<snippet>\", line 4, in <module>\n    f('key')\n",
			"  File \"<snippet>\", line 2, in f\n    return {}[n]\n",
			"KeyError: 'key'\n"}},
		{"printed by the snippet", "import traceback\ntry:\n    int('x')\nexcept ValueError:\n    traceback.print_exc()\n", []string{
			"  File \"<snippet>\", line 3, in <module>\n    int('x')\n", "ValueError: invalid literal"}},
		{"warning", "import warnings\nwarnings.warn('careful')\n", []string{
			"<snippet>:2: UserWarning: careful\n  warnings.warn('careful')\n"}},
		{"syntax error", "print(1)\nx = (\n", []string{"  File \"<snippet>\", line 2\n    x = (\n", "SyntaxError:"}},
		{"custom excepthook", "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__, tb.tb_frame.f_code.co_filename, file=sys.stderr)\n1/0\n", []string{
			"hook ZeroDivisionError <snippet>\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(wire.LanguagePython, tc.code))
			stderr := string(res.Stderr.Data)
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			for _, bad := range []string{"<string>", "_flmbox", "bootstrap"} {
				if strings.Contains(stderr, bad) {
					t.Errorf("stderr shows the bootstrap (%q):\n%s", bad, stderr)
				}
			}
		})
	}
}

// TestRunPythonLikeDashC checks that a snippet runs as python3 -c would run
// it: in __main__, with the working directory on sys.path, nothing of the
// bootstrap left, and the gate closed.
func TestRunPythonLikeDashC(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	if err := os.WriteFile(filepath.Join(a.Dir, "helper.py"), []byte("VALUE = 42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code := `import os, sys, pickle
import helper
class Point:
    pass
names = sorted(n for n in globals() if not n.startswith('__'))
try:
    os.fstat(3)
    gate = 'open'
except OSError:
    gate = 'closed'
print(__name__, repr(sys.path[0]), sys.argv, helper.VALUE, gate, os.getcwd())
print(names)
print(type(pickle.loads(pickle.dumps(Point()))).__name__)
`
	res := run(t, a, request(wire.LanguagePython, code))
	want := fmt.Sprintf("__main__ '' ['-c'] 42 closed %s\n['Point', 'helper', 'os', 'pickle', 'sys']\nPoint\n", a.Dir)
	if res.ExitCode != 0 || string(res.Stdout.Data) != want {
		t.Fatalf("want stdout %q, got %s", want, dump(res))
	}
}

func TestRunShellDetails(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	// $0, the working directory, the gate closed, line numbers unchanged.
	res := run(t, a, request(wire.LanguageShell, "echo \"$0 $(pwd)\"\nif [ -e /proc/$$/fd/3 ]; then echo gate open; else echo gate closed; fi\nnosuchcommand-flmbox"))
	if want := "sh " + a.Dir + "\ngate closed\n"; string(res.Stdout.Data) != want {
		t.Fatalf("want stdout %q, got %s", want, dump(res))
	}
	if stderr := string(res.Stderr.Data); !strings.Contains(stderr, "3: nosuchcommand-flmbox") {
		t.Fatalf("the error names line 3? %s", dump(res))
	}
}

func TestRunStdinAtEOF(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	for _, tc := range []struct{ name, lang, code, want string }{
		{"shell cat", wire.LanguageShell, "cat; echo done", "done\n"},
		{"python read", wire.LanguagePython, "import sys, subprocess\nprint(repr(sys.stdin.read()))\nsubprocess.run(['cat'])\nprint('done')", "''\ndone\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if res := run(t, a, request(tc.lang, tc.code)); string(res.Stdout.Data) != tc.want || res.ExitCode != 0 {
				t.Fatalf("want stdout %q, got %s", tc.want, dump(res))
			}
		})
	}
}

func TestRunStdin(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB: more than a pipe holds
	for _, tc := range []struct{ name, lang, code, stdin, want string }{
		{"shell cat", wire.LanguageShell, "cat; echo done", "line 1\nline 2", "line 1\nline 2done\n"},
		{"shell read", wire.LanguageShell, "read -r x; echo \"got $x\"", "hello\nrest\n", "got hello\n"},
		{"python read", wire.LanguagePython, "import sys\nprint(repr(sys.stdin.read()))", "a\x00b\xffc", "'a\\x00b\\udcffc'\n"},
		{"python child cat", wire.LanguagePython, "import subprocess\nsubprocess.run(['cat'])\nprint()", "from stdin", "from stdin\n"},
		{"python large", wire.LanguagePython, "import sys\nprint(len(sys.stdin.buffer.read()))", big, "1048576\n"},
		{"unread", wire.LanguageShell, "echo ignored", big, "ignored\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(tc.lang, tc.code, func(r *wire.Request) { r.Stdin = []byte(tc.stdin) }))
			if string(res.Stdout.Data) != tc.want || res.ExitCode != 0 {
				t.Fatalf("want stdout %q, got %s", tc.want, dump(res))
			}
		})
	}
	// The next call's stdin is at EOF again.
	if res := run(t, a, request(wire.LanguageShell, "cat; echo done")); string(res.Stdout.Data) != "done\n" {
		t.Fatalf("a call without stdin after calls with: %s", dump(res))
	}
}

func TestRunCallEnv(t *testing.T) {
	t.Parallel()
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin", "A=sandbox", "B=sandbox"}, Spares: withSpares(t)}
	t.Cleanup(func() { a.Close() })
	env := []string{"B=call", "C=first", "C=call"}
	for _, tc := range []struct{ lang, code string }{
		{wire.LanguageShell, "echo $A $B $C"},
		{wire.LanguagePython, "import os; print(os.environ['A'], os.environ['B'], os.environ['C'])"},
	} {
		res := run(t, a, request(tc.lang, tc.code, func(r *wire.Request) { r.Env = env }))
		if want := "sandbox call call\n"; string(res.Stdout.Data) != want || res.ExitCode != 0 {
			t.Fatalf("%s: want stdout %q, got %s", tc.lang, want, dump(res))
		}
		// Only for that call.
		res = run(t, a, request(tc.lang, tc.code))
		if tc.lang == wire.LanguageShell && string(res.Stdout.Data) != "sandbox sandbox\n" {
			t.Fatalf("%s: the next call sees %s", tc.lang, dump(res))
		}
		if tc.lang == wire.LanguagePython && !strings.Contains(string(res.Stderr.Data), "KeyError") {
			t.Fatalf("%s: the next call sees %s", tc.lang, dump(res))
		}
	}
}

func TestRunInterpreter(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	python := hostPython(t)
	// Another Python: a wrapper of the host's that says it ran.
	wrapper := "#!/bin/sh\nFLMBOX_VIA=python3.99 exec " + python + " \"$@\"\n"
	testprog.Write(t, filepath.Join(bin, "python3.99"), []byte(wrapper))
	a := &Agent{Python: python, Dir: t.TempDir(), Env: []string{"PATH=" + bin + ":/usr/bin:/bin"}, Spares: withSpares(t)}
	t.Cleanup(func() { a.Close() })
	for _, tc := range []struct{ name, lang, interp, code, want string }{
		{"python3.99", wire.LanguagePython, "python3.99", "import os, sys; print(sys.argv[0], os.environ.get('FLMBOX_VIA'))", "-c python3.99\n"},
		{"python3 is the default", wire.LanguagePython, "python3", "print(6 * 7)", "42\n"},
		{"sh", wire.LanguageShell, "sh", "echo $0", "sh\n"},
		{"bash", wire.LanguageShell, "bash", "echo $0 ${BASH_VERSION:+bash}", "bash bash\n"},
		{"a version", wire.LanguagePython, "3.99", "import os, sys; print(sys.argv[0], os.environ.get('FLMBOX_VIA'))", "-c python3.99\n"},
		{"python is the default", wire.LanguagePython, "python", "import os; print(os.environ.get('FLMBOX_VIA'))", "None\n"},
		{"version 3 is the default", wire.LanguagePython, "3", "import os; print(os.environ.get('FLMBOX_VIA'))", "None\n"},
		{"a path", wire.LanguagePython, filepath.Join(bin, "python3.99"), "import os; print(os.environ.get('FLMBOX_VIA'))", "python3.99\n"},
		{"a shell's path", wire.LanguageShell, "/bin/sh", "echo $0", "sh\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(tc.lang, tc.code, func(r *wire.Request) { r.Interpreter = tc.interp }))
			if string(res.Stdout.Data) != tc.want || res.ExitCode != 0 {
				t.Fatalf("want stdout %q, got %s", tc.want, dump(res))
			}
		})
	}
	res := run(t, a, request(wire.LanguagePython, "print(1)", func(r *wire.Request) { r.Interpreter = "python2.1" }))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "interpreter python2.1: the sandbox has none: find python2.1 in PATH") {
		t.Fatalf("a missing interpreter: %s", dump(res))
	}
	// A missing version names the Pythons there are.
	res = run(t, a, request(wire.LanguagePython, "print(1)", func(r *wire.Request) { r.Interpreter = "3.98" }))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "interpreter 3.98: the sandbox has no python3.98 in its PATH; it has ") ||
		!strings.Contains(res.Error, "python3, ") || !strings.HasSuffix(res.Error, ", python3.99") {
		t.Fatalf("a missing version: %s", dump(res))
	}
	res = run(t, a, request(wire.LanguageShell, "echo 1", func(r *wire.Request) { r.Interpreter = filepath.Join(bin, "bash") }))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "interpreter "+filepath.Join(bin, "bash")+": the sandbox has none") {
		t.Fatalf("a missing path: %s", dump(res))
	}
}

// TestRunFile: a call with a File runs its code as a file of that name, as
// python3 FILE and sh FILE do, in a directory that goes with the call.
func TestRunFile(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	file := func(name string) func(*wire.Request) { return func(r *wire.Request) { r.File = name } }
	code := "import sys\nprint(__file__ == sys.argv[0], open(__file__).read().endswith('\\n1 / 0\\n'), __file__)\n1 / 0\n"
	res := run(t, a, request(wire.LanguagePython, code, file("main.py")))
	out := strings.Fields(string(res.Stdout.Data))
	if len(out) != 3 || out[0] != "True" || out[1] != "True" || !strings.HasPrefix(out[2], a.Dir+"/.flmbox-") || !strings.HasSuffix(out[2], "/main.py") || res.ExitCode != 1 {
		t.Fatalf("python: %s", dump(res))
	}
	if want := "File \"" + out[2] + "\", line 3, in <module>\n    1 / 0\n"; !strings.Contains(string(res.Stderr.Data), want) {
		t.Fatalf("python's traceback: want %q in %s", want, dump(res))
	}
	if _, err := os.Stat(filepath.Dir(out[2])); !os.IsNotExist(err) {
		t.Fatalf("the code's directory is left after the call: %v", err)
	}
	// Shell: $0, the file's line numbers, and code over what sh -c takes.
	code = "echo \"$0\"; cmp \"$0\" - <<'EOF' && echo same\n" + strings.Repeat("#", wire.MaxShellCodeSize) + "\nEOF\nno_such_command\n"
	code = strings.Replace(code, "cmp \"$0\" - <<'EOF'", "tail -n +2 \"$0\" | head -n 1 | cmp - <<'EOF'", 1)
	res = run(t, a, request(wire.LanguageShell, code, file("main.sh")))
	out = strings.Fields(string(res.Stdout.Data))
	if len(out) != 2 || !strings.HasPrefix(out[0], a.Dir+"/.flmbox-") || !strings.HasSuffix(out[0], "/main.sh") || out[1] != "same" || res.ExitCode != 127 {
		t.Fatalf("shell: %s", dump(res))
	}
	if want := out[0] + ": 4: no_such_command: not found\n"; a.shellIsDash && string(res.Stderr.Data) != want {
		t.Fatalf("shell's error: want %q in %s", want, dump(res))
	}
	// Under another shell, with the call's own environment.
	res = run(t, a, request(wire.LanguageShell, "echo \"$0\" ${BASH_VERSION:+bash} $X", file("main.sh"), func(r *wire.Request) {
		r.Interpreter, r.Env = "bash", []string{"X=x"}
	}))
	if out := string(res.Stdout.Data); !strings.HasSuffix(out, "/main.sh bash x\n") || res.ExitCode != 0 {
		t.Fatalf("bash: %s", dump(res))
	}
	// Without a File, the code has no file.
	res = run(t, a, request(wire.LanguagePython, "import sys; print(globals().get('__file__'), sys.argv)"))
	if string(res.Stdout.Data) != "None ['-c']\n" {
		t.Fatalf("without a file: %s", dump(res))
	}
	if entries, _ := os.ReadDir(a.Dir); len(entries) != 0 {
		t.Fatalf("left in the working directory: %v", entries)
	}
}

func TestRunEnvAndDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := &Agent{Python: hostPython(t), Dir: dir, Env: []string{"PATH=/usr/bin:/bin", "FLMBOX_TEST=yes"}}
	res := run(t, a, request(wire.LanguageShell, "echo \"$FLMBOX_TEST $(pwd)\""))
	if want := "yes " + dir + "\n"; string(res.Stdout.Data) != want {
		t.Fatalf("want stdout %q, got %s", want, dump(res))
	}
}

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	for _, tc := range []struct{ name, lang, code string }{
		{"sleep", wire.LanguageShell, "sleep 100"},
		{"shell loop", wire.LanguageShell, "while true; do :; done"},
		{"python loop", wire.LanguagePython, "while True:\n    pass"},
		{"child ignores SIGTERM", wire.LanguageShell, "trap '' TERM; sh -c 'trap \"\" TERM; sleep 100' & wait"},
		{"python ignores SIGTERM", wire.LanguagePython, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(100)"},
		{"background and foreground", wire.LanguageShell, "sleep 100 & sleep 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(tc.lang, tc.code, func(r *wire.Request) { r.TimeoutMS = 300 }))
			if !res.TimedOut || res.ExitCode != 137 || res.Signal != "SIGKILL" || res.Error != "" {
				t.Fatalf("want a timeout, got %s", dump(res))
			}
		})
	}
}

// waitUntil polls cond until it holds, and fails the test if it does not
// within guard; what says what was awaited.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(guard); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", guard, what)
		}
	}
}

// alive says whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// waitGone fails the test unless process pid is gone (or a zombie) within
// guard.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for alive(pid) {
		if time.Now().After(deadline) {
			unix.Kill(pid, unix.SIGKILL)
			t.Fatalf("process %d survived the call", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pids returns the numbers a snippet printed, one per line.
func pids(t *testing.T, res *wire.Result) []int {
	t.Helper()
	var out []int
	for _, f := range strings.Fields(string(res.Stdout.Data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("want pids, got %s", dump(res))
		}
		out = append(out, pid)
	}
	return out
}

// printGrace is the timeout of snippets that must print before their
// timeout kills them: printing takes milliseconds, the rest is for a busy
// machine. Tests that can do without use a cancellation they order instead.
const printGrace = 2 * time.Second

func TestRunKillsLeftovers(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	for _, tc := range []struct {
		name, lang, code string
		timeout          time.Duration // the default when 0
	}{
		{"shell background", wire.LanguageShell, "sleep 1000 & echo $!", 0},
		{"shell background, pipes closed", wire.LanguageShell, "sleep 1000 >/dev/null 2>&1 & echo $!", 0},
		{"shell nested", wire.LanguageShell, "sh -c 'sleep 1000 & echo $!; sleep 1000 & echo $!' &\nwait", 0},
		{"python subprocess", wire.LanguagePython, "import subprocess\nprint(subprocess.Popen(['sleep', '1000']).pid)", 0},
		{"python fork", wire.LanguagePython, "import os, sys, time\nr, w = os.pipe()\nif os.fork() == 0:\n    print(os.getpid(), flush=True)\n    os.write(w, b'x')\n    time.sleep(1000)\n    sys.exit()\nos.read(r, 1)", 0},
		{"on timeout", wire.LanguageShell, "sleep 1000 & echo $!; sleep 1000", printGrace},
		// Killed once the grace after the snippet's end is over.
		{"ignoring SIGTERM", wire.LanguageShell, "rm -f ready; sh -c \"trap '' TERM; touch ready; exec sleep 1000\" & until [ -e ready ]; do sleep 0.01; done; echo $!", 0},
		{"ignoring SIGTERM, pipes closed", wire.LanguageShell, "rm -f ready; sh -c \"trap '' TERM; touch ready; exec sleep 1000\" >/dev/null 2>&1 & until [ -e ready ]; do sleep 0.01; done; echo $!", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(tc.lang, tc.code, func(r *wire.Request) {
				if tc.timeout > 0 {
					r.TimeoutMS = tc.timeout.Milliseconds()
				}
			}))
			ps := pids(t, res)
			if len(ps) == 0 || res.TimedOut != (tc.timeout > 0) {
				t.Fatalf("want pids, and a timeout only on timeout: %s", dump(res))
			}
			for _, pid := range ps {
				waitGone(t, pid)
			}
		})
	}
}

// TestRunEscapedProcess: a process that leaves the snippet's process group
// survives the call (documented), but holding the output pipes does not make
// the call hang.
func TestRunEscapedProcess(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	res := run(t, a, request(wire.LanguagePython, "import subprocess\nprint(subprocess.Popen(['sleep', '1000'], start_new_session=True).pid)\nprint('bye')"))
	ps := pids(t, &wire.Result{Stdout: wire.Output{Data: bytes.TrimSuffix(res.Stdout.Data, []byte("bye\n"))}})
	for _, pid := range ps {
		unix.Kill(pid, unix.SIGKILL)
	}
	if res.ExitCode != 0 || !strings.HasSuffix(string(res.Stdout.Data), "bye\n") {
		t.Fatalf("got %s", dump(res))
	}
}

func TestRunOutputCaps(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	res := run(t, a, request(wire.LanguageShell, "printf 0123456789abcdefghij; printf ABCDEFGHIJ >&2", func(r *wire.Request) { r.MaxOutput = 10 }))
	if got, want := res.Stdout, (wire.Output{Data: []byte("01234"), Tail: []byte("fghij"), Total: 20, Truncated: true}); !bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Tail, want.Tail) || got.Total != want.Total || !got.Truncated {
		t.Fatalf("stdout %+v, want %+v", got, want)
	}
	if got := res.Stderr; string(got.Data) != "ABCDEFGHIJ" || got.Total != 10 || got.Truncated {
		t.Fatalf("stderr %+v, want all 10 bytes", got)
	}

	// Python's output, long and in many writes.
	res = run(t, a, request(wire.LanguagePython, "for i in range(100000):\n    print(i)", func(r *wire.Request) { r.MaxOutput = 1000 }))
	out, tail := string(res.Stdout.Data), string(res.Stdout.Tail)
	if !res.Stdout.Truncated || res.Stdout.Total != 588890 || !strings.HasPrefix(out, "0\n1\n2\n") || !strings.HasSuffix(tail, "99998\n99999\n") ||
		len(out) != 500 || len(tail) != 500 {
		t.Fatalf("got total %d, truncated %v, %q and %q", res.Stdout.Total, res.Stdout.Truncated, out, tail)
	}
}

// TestRunHugeOutput prints 256 MiB on each stream, eight times the heap it
// may use: the agent keeps the caps and its memory stays flat. Not
// parallel: it measures the heap of the whole test process.
func TestRunHugeOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("prints 512 MiB")
	}
	a := testAgent(t)
	const size = 256 << 20
	var peak uint64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	res := run(t, a, request(wire.LanguageShell, fmt.Sprintf("head -c %d /dev/zero & yes | head -c %d >&2; wait", size, size), func(r *wire.Request) { r.TimeoutMS = 60000 }))
	close(stop)
	sampler.Wait()
	if res.ExitCode != 0 || res.Stdout.Total != size || res.Stderr.Total != size || !res.Stdout.Truncated || !res.Stderr.Truncated {
		t.Fatalf("exit %d, totals %d and %d, error %q", res.ExitCode, res.Stdout.Total, res.Stderr.Total, res.Error)
	}
	if len(res.Stdout.Data)+len(res.Stdout.Tail) != wire.DefaultMaxOutput || !bytes.HasPrefix(res.Stderr.Data, []byte("y\ny\n")) ||
		!bytes.HasSuffix(res.Stderr.Data, []byte("y\n")) || !bytes.HasPrefix(res.Stderr.Tail, []byte("y\n")) {
		t.Fatalf("stdout %d+%d bytes, stderr %d+%d bytes", len(res.Stdout.Data), len(res.Stdout.Tail), len(res.Stderr.Data), len(res.Stderr.Tail))
	}
	t.Logf("peak HeapInuse %d MiB", peak>>20)
	if peak > 64<<20 {
		t.Fatalf("peak HeapInuse %d MiB while the snippet printed %d MiB", peak>>20, 2*size>>20)
	}
}

func TestRunNonUTF8(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	res := run(t, a, request(wire.LanguageShell, `printf '\377\376\000abc\200'; printf '\351t\351' >&2`))
	if !bytes.Equal(res.Stdout.Data, []byte("\xff\xfe\x00abc\x80")) || !bytes.Equal(res.Stderr.Data, []byte("\xe9t\xe9")) {
		t.Fatalf("got %s", dump(res))
	}
	res = run(t, a, request(wire.LanguagePython, `import sys; sys.stdout.buffer.write(b'\xff\x00\xc3')`))
	if !bytes.Equal(res.Stdout.Data, []byte("\xff\x00\xc3")) {
		t.Fatalf("got %s", dump(res))
	}
}

func TestRunLargeCode(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	// Python code of nearly 1 MiB goes through the gate.
	code := strings.Repeat("x = 1  # padding padding padding padding\n", (wire.MaxCodeSize-100)/41) + "print('end', x)\n"
	if res := run(t, a, request(wire.LanguagePython, code)); string(res.Stdout.Data) != "end 1\n" {
		t.Fatalf("got %s", dump(res))
	}
	// Shell code up to MaxShellCodeSize fits in one argument.
	code = "echo end\n" + strings.Repeat("#", wire.MaxShellCodeSize-len("echo end\n"))
	if res := run(t, a, request(wire.LanguageShell, code)); string(res.Stdout.Data) != "end\n" || res.Error != "" {
		t.Fatalf("got %s", dump(res))
	}
}

// limitsOf parses /proc/PID/limits as printed by the snippet.
func limitsOf(t *testing.T, text string) map[string]string {
	t.Helper()
	m := map[string]string{}
	re := regexp.MustCompile(`(?m)^(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)`)
	for _, f := range re.FindAllStringSubmatch(text, -1) {
		m[f[1]] = f[2] + " " + f[3]
	}
	return m
}

func TestRunLimitsApplied(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	limits := wire.Limits{Procs: 123, FileBytes: 5 << 20}
	var as unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_AS, &as)
	want := map[string]string{
		"Max address space": limitsText(as), // the agent's: never set
		"Max processes":     "123 123",
		"Max file size":     "5242880 5242880",
	}
	for _, tc := range []struct{ name, lang, code string }{
		// The shell's own limits as its first command runs, and a child's.
		{"shell itself", wire.LanguageShell, "cat /proc/$$/limits"},
		{"shell child", wire.LanguageShell, "cat /proc/self/limits"},
		{"python itself", wire.LanguagePython, "print(open('/proc/self/limits').read())"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, a, request(tc.lang, tc.code, func(r *wire.Request) { r.Limits = limits }))
			got := limitsOf(t, string(res.Stdout.Data))
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q; got %s", k, got[k], v, dump(res))
				}
			}
		})
	}
	// Zero limits set nothing: the snippet has the agent's.
	var own unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NPROC, &own)
	res := run(t, a, request(wire.LanguagePython, "import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[1])"))
	if got := strings.TrimSpace(string(res.Stdout.Data)); got != strconv.FormatInt(int64(own.Max), 10) && !(own.Max == unix.RLIM_INFINITY && got == "-1") {
		t.Fatalf("RLIMIT_NPROC without a limit: %s, the agent's %d", got, own.Max)
	}
}

// limitsText is a limit as /proc/PID/limits shows it: soft and hard.
func limitsText(l unix.Rlimit) string {
	v := func(n uint64) string {
		if n == unix.RLIM_INFINITY {
			return "unlimited"
		}
		return strconv.FormatUint(n, 10)
	}
	return v(l.Cur) + " " + v(l.Max)
}

func TestRunFileSizeLimit(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	limit := func(r *wire.Request) { r.Limits.FileBytes = 1 << 20 }
	res := run(t, a, request(wire.LanguageShell, "head -c 2000000 /dev/zero > big; echo $?; wc -c < big", limit))
	if got := string(res.Stdout.Data); got != "153\n1048576\n" { // 128 + SIGXFSZ
		t.Fatalf("got %s", dump(res))
	}
	res = run(t, a, request(wire.LanguagePython, "open('big2', 'wb').write(bytes(2000000))", limit))
	if !strings.Contains(string(res.Stderr.Data), "File too large") {
		t.Fatalf("got %s", dump(res))
	}
}

func TestRunBadRequests(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	for _, tc := range []struct {
		name string
		a    *Agent
		req  *wire.Request
		want string
	}{
		{"nil", a, nil, "no request"},
		{"unknown language", a, request("ruby", "puts 1"), `language "ruby"`},
		{"no timeout", a, request(wire.LanguageShell, "true", func(r *wire.Request) { r.TimeoutMS = 0 }), "timeout 0s"},
		{"other version", a, request(wire.LanguageShell, "true", func(r *wire.Request) { r.Version = 7 }), fmt.Sprintf("request speaks protocol 7, this side speaks %d", wire.ProtocolVersion)},
		{"no python", &Agent{Python: "no-such-python-flmbox", Dir: t.TempDir()}, request(wire.LanguagePython, "print(1)"), "find no-such-python-flmbox in PATH"},
		{"bad python path", &Agent{Python: "/no/such/python3", Dir: t.TempDir()}, request(wire.LanguagePython, "print(1)"), "the image has no /no/such/python3"},
		{"bad shell", &Agent{Shell: "/no/such/sh", Dir: t.TempDir()}, request(wire.LanguageShell, "true"), "the image has no /no/such/sh"},
		{"no directory", &Agent{Dir: "/no/such/dir"}, request(wire.LanguageShell, "true"), "start /bin/sh in /no/such/dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.a.Run(context.Background(), tc.req)
			if res.ExitCode != -1 || !strings.Contains(res.Error, tc.want) || res.Version != wire.ProtocolVersion {
				t.Fatalf("want an error containing %q, got %s", tc.want, dump(res))
			}
		})
	}
	// A shell-only agent still runs shell.
	if res := (&Agent{Python: "no-such-python-flmbox", Dir: t.TempDir()}).Run(context.Background(), request(wire.LanguageShell, "echo ok")); string(res.Stdout.Data) != "ok\n" {
		t.Fatalf("shell without python: %s", dump(res))
	}
}

func TestRunCancelled(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	pidFile := filepath.Join(a.Dir, "pid")
	go func() {
		for {
			if _, err := os.Stat(pidFile); err == nil {
				cancel(errors.New("the test gave up"))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	res := a.Run(ctx, request(wire.LanguageShell, "echo started; echo $$ > pid.tmp; mv pid.tmp pid; sleep 1000"))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "snippet cancelled and killed: the test gave up") || string(res.Stdout.Data) != "started\n" {
		t.Fatalf("got %s", dump(res))
	}
	b, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)

	// Already cancelled: nothing runs.
	if res := a.Run(ctx, request(wire.LanguageShell, "touch ran")); res.ExitCode != -1 || !strings.Contains(res.Error, "the test gave up") {
		t.Fatalf("got %s", dump(res))
	}
	if _, err := os.Stat(filepath.Join(a.Dir, "ran")); err == nil {
		t.Fatal("a cancelled context ran the snippet")
	}
}

// TestRunConcurrent runs snippets at once on one agent; each gets its own
// output.
func TestRunConcurrent(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	const n = 8
	results := make([]*wire.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			lang, code := wire.LanguageShell, fmt.Sprintf("echo %d; echo err%d >&2", i, i)
			if i%2 == 1 {
				lang, code = wire.LanguagePython, fmt.Sprintf("import sys; print(%d); print('err%d', file=sys.stderr)", i, i)
			}
			results[i] = a.Run(context.Background(), request(lang, code))
		})
	}
	wg.Wait()
	for i, res := range results {
		if string(res.Stdout.Data) != fmt.Sprintf("%d\n", i) || string(res.Stderr.Data) != fmt.Sprintf("err%d\n", i) {
			t.Errorf("snippet %d: %s", i, dump(res))
		}
	}
}
