package app

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/snippet/wire"
)

// agentLog is what a fake agent was sent, in order.
type agentLog struct {
	mu     sync.Mutex
	calls  []wire.Request
	copies []copyRecord
	order  []string // "copy DST", "reset", "call"
}

// copyRecord is one copy a fake agent received: where, and the tar entries.
type copyRecord struct {
	dst     string
	into    bool
	entries map[string]string // name: contents, or "-> TARGET" for a link
}

func (l *agentLog) snapshot() ([]wire.Request, []copyRecord, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls), slices.Clone(l.copies), slices.Clone(l.order)
}

// fakeSandbox makes sandbox name under root (a record saying running) and
// serves its agent's socket: copies are read and recorded, calls recorded
// and answered with answer's result (the code's exit status 0 and no
// output if answer is nil).
func fakeSandbox(t *testing.T, root, name string, answer func(*wire.Request) *wire.Result) *agentLog {
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
	log := &agentLog{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFake(t, c, log, answer)
		}
	}()
	return log
}

func serveFake(t *testing.T, c net.Conn, log *agentLog, answer func(*wire.Request) *wire.Result) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return // a connection that only checks the agent accepts
	}
	var req wire.Request
	if err := json.Unmarshal(line, &req); err != nil {
		t.Errorf("fake agent: %v", err)
		return
	}
	res := &wire.Result{Version: wire.ProtocolVersion}
	log.mu.Lock()
	switch {
	case req.Copy != nil:
		log.mu.Unlock()
		in := copyRecord{dst: req.Copy.Path, into: req.Copy.Into, entries: map[string]string{}}
		tr := tar.NewReader(wire.FrameReader(br))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			b, _ := io.ReadAll(tr)
			if h.Typeflag == tar.TypeSymlink {
				b = []byte("-> " + h.Linkname)
			}
			in.entries[h.Name] = string(b)
		}
		res.Copied = &wire.CopyStats{}
		log.mu.Lock()
		log.copies = append(log.copies, in)
		log.order = append(log.order, "copy "+in.dst)
	case req.Reset && req.Code == "":
		log.order = append(log.order, "reset")
	default:
		log.calls = append(log.calls, req)
		log.order = append(log.order, "call")
		if answer != nil {
			res = answer(&req)
			res.Version = wire.ProtocolVersion
		}
	}
	log.mu.Unlock()
	b, _ := json.Marshal(res)
	c.Write(append(b, '\n'))
}

// runCLI runs flmbox with args and stdin.
func runCLI(ctx context.Context, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = runApp(ctx, append([]string{"flmbox"}, args...), stdin, &out, &errOut)
	return code, out.String(), errOut.String()
}

// hostFiles makes a file, a directory with a file and a link, under a new
// directory, and returns their paths.
func hostFiles(t *testing.T) (file, dir string) {
	t.Helper()
	base := t.TempDir()
	file, dir = filepath.Join(base, "hermes_tools.py"), filepath.Join(base, "data")
	if err := os.WriteFile(file, []byte("def tool(): pass\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.csv"), []byte("1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return file, dir
}

// TestRunSendsCallSettings: -e (repeatable, each value once and whole), -i (flmbox's
// stdin), --copy (before the code, as flmbox cp sends it: links as links)
// and FILE (run as a file of its base name) reach the agent as the call's
// own; -c and - send no file name.
func TestRunSendsCallSettings(t *testing.T) {
	root := t.TempDir()
	log := fakeSandbox(t, root, "sb", nil)
	tools, data := hostFiles(t)
	script := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(script, []byte("import hermes_tools\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t.Context(), strings.NewReader("input\x00bytes"), "--root", root, "run", "--sandbox", "sb",
		"--copy", tools+":/tmp/hermes_tools.py", "--copy", data+":/tmp/in/", "-e", "HERMES_RPC_TOKEN=t", "-e", "LIST=a,b", "-i", script)
	if code != 0 || stdout != "" || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	calls, copies, order := log.snapshot()
	if !slices.Equal(order, []string{"copy /tmp/hermes_tools.py", "copy /tmp/in", "call"}) {
		t.Fatalf("the agent was sent %q", order)
	}
	if c := copies[0]; c.into || len(c.entries) != 1 || c.entries["hermes_tools.py"] != "def tool(): pass\n" {
		t.Errorf("copy of a file: %+v", c)
	}
	if c := copies[1]; !c.into || c.entries["data/a.csv"] != "1,2\n" || c.entries["data/link"] != "-> /etc/passwd" {
		t.Errorf("copy of a directory: %+v", c)
	}
	req := calls[0]
	if req.Code != "import hermes_tools\n" || req.File != "script.py" || string(req.Stdin) != "input\x00bytes" ||
		!slices.Equal(req.Env, []string{"HERMES_RPC_TOKEN=t", "LIST=a,b"}) {
		t.Errorf("the call: code %q file %q stdin %q env %q", req.Code, req.File, req.Stdin, req.Env)
	}

	// -c and - run as before: no file name, no stdin without -i.
	for _, args := range [][]string{{"-c", "print(1)"}, {"-"}} {
		if code, _, stderr := runCLI(t.Context(), strings.NewReader("print(1)"), append([]string{"--root", root, "run", "--sandbox", "sb"}, args...)...); code != 0 {
			t.Fatalf("%q: exit %d, %q", args, code, stderr)
		}
		calls, _, _ := log.snapshot()
		if req := calls[len(calls)-1]; req.Code != "print(1)" || req.File != "" || req.Stdin != nil || req.Env != nil {
			t.Errorf("%q: the call: %+v", args, req)
		}
	}
}

// TestRunResetThenCopy: with --reset and --copy the sandbox is reset
// first, then copied into, then called: a reset empties /tmp.
func TestRunResetThenCopy(t *testing.T) {
	root := t.TempDir()
	log := fakeSandbox(t, root, "sb", nil)
	tools, _ := hostFiles(t)
	if code, _, stderr := runCLI(t.Context(), nil, "--root", root, "run", "--sandbox", "sb", "--reset", "--copy", tools+":/tmp/t.py", "-c", "1"); code != 0 {
		t.Fatalf("exit %d, %q", code, stderr)
	}
	calls, _, order := log.snapshot()
	if !slices.Equal(order, []string{"reset", "copy /tmp/t.py", "call"}) || calls[0].Reset {
		t.Fatalf("the agent was sent %q, the call with reset %v", order, calls[0].Reset)
	}
}

// TestBatchEnv: with --batch, -e is every snippet's.
func TestBatchEnv(t *testing.T) {
	root := t.TempDir()
	log := fakeSandbox(t, root, "sb", nil)
	code, stdout, stderr := runCLI(t.Context(), strings.NewReader(`{"codes": ["1", "2"]}`), "--root", root, "run", "--sandbox", "sb", "--batch", "-", "-e", "K=V")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	calls, _, _ := log.snapshot()
	if len(calls) != 2 || !slices.Equal(calls[0].Env, []string{"K=V"}) || !slices.Equal(calls[1].Env, []string{"K=V"}) {
		t.Errorf("calls %+v", calls)
	}
}

// TestRunPrintsTails: a truncated stream is printed as its first half and
// its last, with a note on stderr saying how much was left out between
// them; --json carries the tail apart, the prefix exact, and so does a
// batch; in both the kill note ends stderr's tail.
func TestRunPrintsTails(t *testing.T) {
	root := t.TempDir()
	fakeSandbox(t, root, "sb", func(*wire.Request) *wire.Result {
		return &wire.Result{ExitCode: 137, Signal: "SIGKILL", TimedOut: true,
			Stdout: wire.Output{Data: []byte("head"), Tail: []byte("tail"), Total: 108, Truncated: true},
			Stderr: wire.Output{Data: []byte("err\xff"), Tail: []byte("\xfeend"), Total: 10, Truncated: true}}
	})
	code, stdout, stderr := runCLI(t.Context(), nil, "--root", root, "run", "--sandbox", "sb", "--timeout", "2s", "-c", "1")
	want := "err\xff\xfeend" +
		"flmbox: stdout: 100 bytes left out between the first 4 and the last 4 (a larger --max-output keeps more)\n" +
		"flmbox: stderr: 2 bytes left out between the first 4 and the last 4 (a larger --max-output keeps more)\n" +
		"flmbox: the snippet timed out after 2s and was killed\n"
	if code != runcmd.ExitTimeout || stdout != "headtail" || stderr != want {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	_, stdout, _ = runCLI(t.Context(), nil, "--root", root, "run", "--sandbox", "sb", "--json", "-c", "1")
	var j runcmd.JSON
	if err := json.Unmarshal([]byte(stdout), &j); err != nil {
		t.Fatal(err)
	}
	if j.Stdout != "head" || j.StdoutTail != "tail" || j.StdoutBytes != 108 || !j.StdoutTruncated || j.StdoutBase64 != "" ||
		j.StderrBase64 != "ZXJy/w==" || j.StderrTailBase64 != "/mVuZA==" || j.StderrTail != "\uFFFDend"+"flmbox: the snippet timed out after 30s and was killed\n" {
		t.Errorf("json: %s", stdout)
	}
	_, stdout, _ = runCLI(t.Context(), strings.NewReader(`{"codes": ["1"]}`), "--root", root, "run", "--sandbox", "sb", "--batch", "-")
	var arr []batchResult
	if err := json.Unmarshal([]byte(stdout), &arr); err != nil || len(arr) != 1 {
		t.Fatalf("batch: %s (%v)", stdout, err)
	}
	if b := arr[0]; b.Stdout != "head" || b.StdoutTail != "tail" || !b.StdoutTruncated || b.Stderr != "err\uFFFD" ||
		b.StderrTail != "\uFFFDend"+"flmbox: the snippet timed out after 30s and was killed\n" || b.StderrTailBase64 != "/mVuZA==" {
		t.Errorf("batch: %s", stdout)
	}
}

// TestRunInputRefused: bad -i, --copy and -e uses are refused with one
// line, exit 125, before any sandbox is looked up and before the state
// root is even made.
func TestRunInputRefused(t *testing.T) {
	tools, _ := hostFiles(t)
	batch := filepath.Join(t.TempDir(), "b.json")
	if err := os.WriteFile(batch, []byte(`{"codes": ["1"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	big := strings.NewReader(strings.Repeat("x", sandbox.MaxStdinSize+1))
	for _, tc := range []struct {
		name  string
		stdin io.Reader
		args  []string
		want  string
	}{
		{"-i with code on stdin", nil, []string{"-i", "-"}, "--interactive gives flmbox's stdin to the snippet: the code cannot come from stdin (-) too"},
		{"-i with a batch", nil, []string{"-i", "--batch", batch}, "--interactive does not apply to --batch"},
		{"-i with a batch on stdin", nil, []string{"--batch", "-", "--interactive"}, "--interactive does not apply to --batch"},
		{"too much stdin", big, []string{"-i", "-c", "1"}, "--interactive: stdin holds more than 8388608 bytes (8MiB)"},
		{"--copy with a batch", nil, []string{"--copy", tools + ":/tmp/t.py", "--batch", batch}, "--copy does not apply to --batch"},
		{"--copy without a colon", nil, []string{"--copy", tools, "-c", "1"}, "want HOST_PATH:SANDBOX_PATH"},
		{"--copy without a host path", nil, []string{"--copy", ":/tmp/x", "-c", "1"}, "want HOST_PATH:SANDBOX_PATH"},
		{"--copy from stdin", nil, []string{"--copy", "-:/tmp/x", "-c", "1"}, "takes a host path; a tar stream on stdin goes in with flmbox cp - NAME:DIR"},
		{"--copy to a relative path", nil, []string{"--copy", tools + ":tmp/x", "-c", "1"}, `"tmp/x", must be absolute and under /tmp`},
		{"--copy outside /tmp", nil, []string{"--copy", tools + ":/etc/x", "-c", "1"}, `"/etc/x", must be absolute and under /tmp`},
		{"--copy out of /tmp by ..", nil, []string{"--copy", tools + ":/tmp/../etc", "-c", "1"}, "must be absolute and under /tmp"},
		{"--copy of a missing path", nil, []string{"--copy", "/nonexistent/x:/tmp/x", "-c", "1"}, "/nonexistent: no such file or directory"},
		{"a bad -e", nil, []string{"-e", "NOVALUE", "-c", "1"}, `env "NOVALUE": want NAME=VALUE`},
		{"a bad -e in a batch", nil, []string{"-e", "=x", "--batch", batch}, `env "=x": want NAME=VALUE`},
	} {
		for _, target := range [][]string{{"--sandbox", "s1"}, {"--image", "img"}} {
			t.Run(tc.name+target[0], func(t *testing.T) {
				root := filepath.Join(t.TempDir(), "root")
				stdin := tc.stdin
				if big, ok := stdin.(*strings.Reader); ok {
					big.Seek(0, io.SeekStart)
				}
				code, stdout, stderr := runCLI(t.Context(), stdin, append(append([]string{"--root", root, "run"}, target...), tc.args...)...)
				if code != 125 || stdout != "" || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
					t.Fatalf("exit %d, stdout %q, stderr %q; want 125 and one line with %q", code, stdout, stderr, tc.want)
				}
				if _, err := os.Stat(root); !os.IsNotExist(err) {
					t.Errorf("the state root was made (%v)", err)
				}
			})
		}
	}
}

// TestRunInterruptedReadingStdin: Ctrl-C while flmbox waits for its stdin
// (-i, or code on -) ends it at once, 130, nothing run.
func TestRunInterruptedReadingStdin(t *testing.T) {
	for _, args := range [][]string{{"-i", "-c", "1"}, {"-"}} {
		pr, pw := io.Pipe() // sends nothing
		defer pw.Close()
		ctx, cancel := context.WithCancelCause(t.Context())
		go func() {
			pw.Write(nil)
			cancel(&runcmd.Interrupt{Signal: syscall.SIGINT})
		}()
		root := filepath.Join(t.TempDir(), "root")
		code, stdout, stderr := runCLI(ctx, pr, append([]string{"--root", root, "run", "--sandbox", "s1"}, args...)...)
		if code != 130 || stdout != "" || stderr != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// TestRunFlagsInteractiveSize: --interactive's usage says the protocol's
// bound.
func TestRunFlagsInteractiveSize(t *testing.T) {
	for _, f := range runcmd.RunFlags {
		if f.Name == "interactive" && (sandbox.MaxStdinSize != 8<<20 || !strings.Contains(f.Usage, "at most 8MiB")) {
			t.Errorf("--interactive's usage %q, the protocol's bound %s", f.Usage, strconv.Itoa(sandbox.MaxStdinSize))
		}
	}
}

// TestEnvFlags: run's -e is its call's, never the new sandbox's (whose
// environment is part of its pool's shape); sandbox create's is the
// sandbox's. Either keeps each value whole, given once.
func TestEnvFlags(t *testing.T) {
	parse := func(flags []cli.Flag, action func(c *cli.Context) error, args ...string) {
		t.Helper()
		app := &cli.App{Flags: flags, Action: action, Writer: io.Discard, ErrWriter: io.Discard}
		if err := app.Run(append([]string{"flmbox"}, args...)); err != nil {
			t.Fatal(err)
		}
	}
	parse(append(sandboxFlags(), tableFlags(runcmd.RunFlags)...), func(c *cli.Context) error {
		spec, err := specFrom(c)
		req, rerr := snippetRequest(c)
		if err != nil || rerr != nil || spec.Env != nil || !slices.Equal(req.Env, []string{"A=1,2", "B=x"}) {
			t.Errorf("run: spec env %q (%v), call env %q (%v)", spec.Env, err, req.Env, rerr)
		}
		return nil
	}, "--image", "img", "-e", "A=1,2", "-e", "B=x", "-c", "1")
	parse(append(sandboxFlags(), sandboxEnvFlag()), func(c *cli.Context) error {
		spec, err := sandboxSpec(c)
		if err != nil || !slices.Equal(spec.Env, []string{"A=1,2", "B=x"}) {
			t.Errorf("create: spec env %q (%v)", spec.Env, err)
		}
		return nil
	}, "--env", "A=1,2", "--env", "B=x")
}
