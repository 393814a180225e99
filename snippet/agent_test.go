package snippet

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	"github.com/flmbox/flmbox/snippet/wire"
	"golang.org/x/sys/unix"
)

// Environment of the test binary run as a helper agent (serveHelper).
const (
	helperSocketEnv    = "FLMBOX_SNIPPET_HELPER_SOCKET"
	helperDirEnv       = "FLMBOX_SNIPPET_HELPER_DIR"
	helperSubreaperEnv = "FLMBOX_SNIPPET_HELPER_SUBREAPER"
	helperSparesEnv    = "FLMBOX_SNIPPET_HELPER_SPARES"
	// helperKeepStraysEnv turns the sweep of strays off, to leave them to a
	// reset, as when calls overlap all the time.
	helperKeepStraysEnv = "FLMBOX_SNIPPET_HELPER_KEEP_STRAYS"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperSocketEnv) != "" {
		if err := serveHelper(); err != nil {
			fmt.Fprintln(os.Stderr, "helper agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// The tests mostly wait for processes and timers, not for a CPU: unless
	// -test.parallel says otherwise, four run at once for each CPU, not one.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		flag.Set("test.parallel", strconv.Itoa(4*runtime.GOMAXPROCS(0)))
	}
	os.Exit(m.Run())
}

// serveHelper is the test binary as an agent in its own process, as flmbox
// agent runs one: optionally a child subreaper (as PID 1 of a sandbox is),
// optionally as another user. SIGTERM stops it.
func serveHelper() error {
	if os.Getenv(helperSubreaperEnv) != "" {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return err
		}
	}
	ln, err := net.Listen("unix", os.Getenv(helperSocketEnv))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	a := &Agent{Python: "/usr/bin/python3", Dir: os.Getenv(helperDirEnv), CleanDirs: []string{os.Getenv(helperDirEnv)},
		Spares: os.Getenv(helperSparesEnv) != "", KillStrays: os.Getenv(helperKeepStraysEnv) == ""}
	return a.Serve(ctx, ln)
}

// helper is an agent running in another process.
type helper struct {
	cmd    *exec.Cmd
	socket string
	dir    string
}

// startHelper runs the test binary as an agent; uid, when not 0, is the
// user it runs as (the test must then be root); env is added to its
// environment (helperSparesEnv=1, ...).
func startHelper(t *testing.T, subreaper bool, uid int, env ...string) *helper {
	t.Helper()
	// A directory every user can use, for the socket and the snippets, and
	// for the binary when the helper runs as another user.
	base, err := os.MkdirTemp("", "flmbox-snippet-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o777)
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if uid != 0 {
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(base, "snippet.test")
		testprog.Write(t, bin, data)
	}
	h := &helper{socket: filepath.Join(base, "agent.sock"), dir: filepath.Join(base, "tmp")}
	if err := os.Mkdir(h.dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(h.dir, 0o777)
	h.cmd = exec.Command(bin, "-test.run=^$")
	h.cmd.Env = append(os.Environ(), helperSocketEnv+"="+h.socket, helperDirEnv+"="+h.dir)
	h.cmd.Env = append(h.cmd.Env, env...)
	if subreaper {
		h.cmd.Env = append(h.cmd.Env, helperSubreaperEnv+"=1")
	}
	if uid != 0 {
		h.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	h.cmd.Stderr = os.Stderr
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.cmd.Process.Signal(syscall.SIGTERM)
		h.cmd.Wait()
	})
	// Wait until it accepts: the socket file exists from bind, before listen,
	// and a connection in between is refused.
	for deadline := time.Now().Add(guard); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.Dial("unix", h.socket)
		if err == nil {
			conn.Close()
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("the helper agent did not listen: %v", err)
		}
	}
}

// serve runs a's Serve on a socket in a temporary directory until the test
// ends, and returns the socket's path.
func serve(t testing.TB, a *Agent) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return path
}

func call(t *testing.T, socket string, req *wire.Request) *wire.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard+5*time.Second)
	defer cancel()
	res, err := wire.Call(ctx, socket, req)
	if err != nil {
		t.Fatalf("Call: %v", err)
	}
	return res
}

func TestServeCall(t *testing.T) {
	t.Parallel()
	socket := serve(t, testAgent(t))
	for _, tc := range []struct {
		name   string
		req    *wire.Request
		stdout string
		exit   int
	}{
		{"python", request(wire.LanguagePython, "print('hello')\nraise SystemExit(4)"), "hello\n", 4},
		{"shell", request(wire.LanguageShell, "echo hello"), "hello\n", 0},
		{"non-UTF-8 bytes", request(wire.LanguageShell, `printf '\377\000\200ok'`), "\xff\x00\x80ok", 0},
		{"capped", request(wire.LanguageShell, "printf 0123456789abcdefghij", func(r *wire.Request) { r.MaxOutput = 10 }), "01234|fghij", 0},
		{"timeout", request(wire.LanguageShell, "echo started; sleep 100", func(r *wire.Request) { r.TimeoutMS = printGrace.Milliseconds() }), "started\n", 137},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := call(t, socket, tc.req)
			stdout := string(res.Stdout.Data)
			if res.Stdout.Truncated {
				stdout += "|" + string(res.Stdout.Tail) // carried over the wire too
			}
			if stdout != tc.stdout || res.ExitCode != tc.exit || res.Version != wire.ProtocolVersion {
				t.Fatalf("want stdout %q exit %d, got %s", tc.stdout, tc.exit, dump(res))
			}
		})
	}
}

// TestServeConcurrent shows that the agent runs calls at once: each snippet
// waits until all of them have started.
func TestServeConcurrent(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	socket := serve(t, a)
	const n = 6
	code := `touch started.%d
i=0
while [ "$(ls started.* | wc -l)" -lt %d ]; do
  i=$((i+1)); [ $i -gt 800 ] && { echo alone; exit 1; }
  sleep 0.01
done
echo %d`
	var wg sync.WaitGroup
	results := make([]*wire.Result, n)
	for i := range n {
		wg.Go(func() {
			results[i], _ = wire.Call(context.Background(), socket, request(wire.LanguageShell, fmt.Sprintf(code, i, n, i)))
		})
	}
	wg.Wait()
	for i, res := range results {
		if res == nil || string(res.Stdout.Data) != fmt.Sprintf("%d\n", i) {
			t.Errorf("call %d: %+v", i, res)
		}
	}
}

// fakeAgent answers every connection with answer after reading the request.
func fakeAgent(t *testing.T, answer string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	serveUnix(t, path, func(conn net.Conn) {
		var req json.RawMessage // the client keeps sending open: no EOF
		json.NewDecoder(conn).Decode(&req)
		io.WriteString(conn, answer)
		conn.Close()
	})
	return path
}

// serveUnix listens on a Unix socket at path and handles each connection
// on a goroutine of its own until the test ends.
func serveUnix(t *testing.T, path string, handle func(net.Conn)) {
	t.Helper()
	ln, err := net.Listen("unix", path)
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
			go handle(c)
		}
	}()
}

func TestCallVersionMismatch(t *testing.T) {
	t.Parallel()
	other := wire.ProtocolVersion + 1
	// A newer agent: its result may not even parse as ours.
	socket := fakeAgent(t, fmt.Sprintf(`{"version": %d, "exit_code": "something else", "error": "whatever"}`, other))
	_, err := wire.Call(context.Background(), socket, request(wire.LanguageShell, "true"))
	want := fmt.Sprintf("agent speaks protocol %d, this client %d: the sandbox was made by another flmbox", other, wire.ProtocolVersion)
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !errors.Is(err, wire.ErrProtocolVersion) {
		t.Fatalf("Call = %v", err)
	}

	// A request of another version to this agent.
	socket = serve(t, testAgent(t))
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, `{"version": %d, "language": "cobol", "code": {"new": "shape"}}`, other)
	conn.(*net.UnixConn).CloseWrite()
	var res wire.Result
	if err := json.NewDecoder(conn).Decode(&res); err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprintf("request speaks protocol %d, this side speaks %d", other, wire.ProtocolVersion)
	if res.Version != wire.ProtocolVersion || res.ExitCode != -1 || !strings.Contains(res.Error, want) {
		t.Fatalf("got %s", dump(&res))
	}
}

func TestCallAgentNotAnswering(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A socket nobody listens on: bound, never listening, closed. (A
	// listener closed would still accept while a child that a test running
	// in parallel forks holds it, until its exec.)
	stale := filepath.Join(dir, "stale.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: stale})
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, socket, want string }{
		{"no socket", filepath.Join(dir, "missing.sock"), "no such file or directory"},
		{"stale socket", stale, "connection refused"},
		{"agent hangs up", fakeAgent(t, ""), "the sandbox's agent hung up without an answer: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wire.Call(context.Background(), tc.socket, request(wire.LanguageShell, "true"))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("Call = %v, want an error containing %q", err, tc.want)
			}
			if tc.name != "agent hangs up" && !strings.Contains(err.Error(), "the sandbox's agent is not answering: ") {
				t.Fatalf("Call = %v", err)
			}
		})
	}
}

func TestCallBadAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, answer, want string }{
		{"not JSON", "hello", "read the answer: invalid character"},
		{"too long", `{"version": 1, "error": "` + strings.Repeat("x", 4<<20) + `"}`, "read the agent's answer: over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wire.Call(context.Background(), fakeAgent(t, tc.answer), request(wire.LanguageShell, "true"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Call = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCallValidates(t *testing.T) {
	t.Parallel()
	_, err := wire.Call(context.Background(), "/no/such/socket", request("ruby", "puts 1"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Call = %v", err)
	}
}

// TestCallCancelKillsSnippet: a client that gives up closes the connection,
// and the agent kills the snippet instead of letting it run to its timeout.
func TestCallCancelKillsSnippet(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	socket := serve(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	pidFile := filepath.Join(a.Dir, "pid")
	go func() {
		for ctx.Err() == nil {
			if _, err := os.Stat(pidFile); err == nil {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err := wire.Call(ctx, socket, request(wire.LanguageShell, "echo $$ > pid.tmp; mv pid.tmp pid; sleep 1000", func(r *wire.Request) { r.TimeoutMS = 60000 }))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Call = %v, want context.Canceled", err)
	}
	b, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

// TestCallInterrupted: a call whose context is cancelled interrupts its
// snippet: the agent kills it and answers with what it printed so far, and
// Call returns that with an error matching ErrInterrupted and the cause.
func TestCallInterrupted(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	socket := serve(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	pidFile := filepath.Join(a.Dir, "pid")
	go func() {
		for ctx.Err() == nil {
			if _, err := os.Stat(pidFile); err == nil {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	res, err := wire.Call(ctx, socket, request(wire.LanguageShell, "echo so far; echo err >&2; echo $$ > pid.tmp; mv pid.tmp pid; sleep 1000", func(r *wire.Request) { r.TimeoutMS = 60000 }))
	if !errors.Is(err, wire.ErrInterrupted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Call = %v, want ErrInterrupted and context.Canceled", err)
	}
	if res == nil || !res.Interrupted || res.ExitCode != 137 || res.Signal != "SIGKILL" || res.Error != "" ||
		string(res.Stdout.Data) != "so far\n" || string(res.Stderr.Data) != "err\n" || res.TimedOut {
		t.Fatalf("got %s", dump(res))
	}
	b, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)

	// A snippet that ends before the interrupt is answered in full.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	res, err = wire.Call(ctx, socket, request(wire.LanguageShell, "true"))
	if !errors.Is(err, wire.ErrInterrupted) || (res != nil && res.Error == "" && !res.Interrupted && res.ExitCode != 0) {
		t.Fatalf("Call = %s, %v", dump(res), err)
	}
}

// TestServeOldClient: a client of before interrupts half-closes the
// connection after its request; the agent runs the snippet to its end all
// the same, and only a full hangup kills it.
func TestServeOldClient(t *testing.T) {
	t.Parallel()
	socket := serve(t, testAgent(t))
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := request(wire.LanguageShell, "sleep 0.2; echo done")
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		t.Fatal(err)
	}
	conn.(*net.UnixConn).CloseWrite()
	var res wire.Result
	if err := json.NewDecoder(conn).Decode(&res); err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Interrupted || string(res.Stdout.Data) != "done\n" {
		t.Fatalf("got %s", dump(&res))
	}
}

// TestCallInterruptedOldAgent: an agent of before interrupts reads the
// request and never answers the interrupt; Call gives up after a few
// seconds, without a result (and its caller's close kills the snippet).
func TestCallInterruptedOldAgent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	read := make(chan struct{})
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		var req json.RawMessage
		json.NewDecoder(conn).Decode(&req)
		close(read)
		io.Copy(io.Discard, conn) // the interrupt's EOF, ignored
		time.Sleep(time.Minute)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-read
		cancel()
	}()
	res, err := wire.Call(ctx, path, request(wire.LanguageShell, "sleep 1000"))
	if res != nil || !errors.Is(err, wire.ErrInterrupted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Call = %s, %v", dump(res), err)
	}
}

// TestServeStops: cancelling Serve's context kills the running snippets,
// answers their clients and returns.
func TestServeStops(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	a := testAgent(t)
	go func() { served <- a.Serve(ctx, ln) }()
	called := make(chan *wire.Result, 1)
	go func() {
		res, err := wire.Call(context.Background(), path, request(wire.LanguageShell, "touch started; sleep 1000"))
		if err != nil {
			t.Errorf("Call: %v", err)
		}
		called <- res
	}()
	for deadline := time.Now().Add(guard); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(a.Dir, "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the snippet did not start")
		}
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve = %v", err)
		}
	case <-time.After(guard):
		t.Fatal("Serve did not return")
	}
	if res := <-called; res == nil || res.ExitCode != -1 || !strings.Contains(res.Error, "snippet cancelled and killed: the agent is stopping") {
		t.Fatalf("the running call got %+v", res)
	}
	if _, err := wire.Call(context.Background(), path, request(wire.LanguageShell, "true")); err == nil {
		t.Fatal("a stopped agent answered")
	}
}

// childrenOf returns the state letters of the children of process ppid.
func childrenOf(t *testing.T, ppid int) map[int]string {
	t.Helper()
	out := map[int]string{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // state, ppid, ...
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			out[pid] = f[0]
		}
	}
	return out
}

// TestServeReapsOrphans runs an agent that is a child subreaper, as PID 1 of
// a sandbox is: the background processes that the kernel reparents to it and
// that it kills must not stay as zombies.
func TestServeReapsOrphans(t *testing.T) {
	t.Parallel()
	h := startHelper(t, true, 0)
	for i := 0; i < 5; i++ {
		call(t, h.socket, request(wire.LanguageShell, "sleep 1000 & sleep 1000 & sh -c 'sleep 1000 &' ; echo $!"))
		call(t, h.socket, request(wire.LanguagePython, "import os, time\nif os.fork() == 0:\n    time.sleep(1000)\n"))
	}
	deadline := time.Now().Add(guard)
	for {
		kids := childrenOf(t, h.cmd.Process.Pid)
		if len(kids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's children after the calls (pid: state): %v", kids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRunForkBomb runs a fork bomb as an unprivileged user (root ignores
// RLIMIT_NPROC): fork fails past the limit and the next call works.
func TestRunForkBomb(t *testing.T) {
	t.Parallel()
	uid := 0
	if os.Geteuid() == 0 {
		uid = 65534 // the sandbox's user
	}
	h := startHelper(t, true, uid)
	bomb := "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; echo spawned $i"
	res := call(t, h.socket, request(wire.LanguageShell, bomb, func(r *wire.Request) {
		r.Limits.Procs = int64(len(tasksOf(t, os.Geteuid(), uid)) + 30)
	}))
	if !strings.Contains(strings.ToLower(string(res.Stderr.Data)), "fork") || strings.Contains(string(res.Stdout.Data), "spawned 200") {
		t.Fatalf("the fork bomb was not stopped: %s", dump(res))
	}
	t.Logf("fork bomb: %s", dump(res))
	if res := call(t, h.socket, request(wire.LanguageShell, "echo alive")); string(res.Stdout.Data) != "alive\n" {
		t.Fatalf("the next call: %s", dump(res))
	}
}

// tasksOf returns the tasks (threads included, as RLIMIT_NPROC counts them)
// of the user that runs the helper.
func tasksOf(t *testing.T, euid, uid int) []string {
	t.Helper()
	if uid == 0 {
		uid = euid
	}
	var tasks []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "status"))
		if err != nil || !strings.Contains(string(b), fmt.Sprintf("\nUid:\t%d\t", uid)) {
			continue
		}
		ts, _ := os.ReadDir(filepath.Join("/proc", d.Name(), "task"))
		for _, task := range ts {
			tasks = append(tasks, task.Name())
		}
	}
	return tasks
}

// failingListener hands out its first connection, then fails.
type failingListener struct {
	net.Listener
	accepted bool
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.accepted {
		return nil, errors.New("the listener broke")
	}
	l.accepted = true
	return l.Listener.Accept()
}

// TestServeListenerFails: Serve returns the listener's error after the
// calls in flight were killed and answered.
func TestServeListenerFails(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	called := make(chan *wire.Result, 1)
	go func() {
		res, _ := wire.Call(context.Background(), path, request(wire.LanguageShell, "sleep 1000"))
		called <- res
	}()
	go func() { served <- testAgent(t).Serve(context.Background(), &failingListener{Listener: ln}) }()
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "accept a client: the listener broke") {
			t.Fatalf("Serve = %v", err)
		}
	case <-time.After(guard):
		t.Fatal("Serve did not return")
	}
	if res := <-called; res == nil || !strings.Contains(res.Error, "the agent is stopping") {
		t.Fatalf("the call in flight got %+v", res)
	}
}

// TestCallPing: wire.Call takes a ping, which the agent answers at once.
func TestCallPing(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	if res := call(t, serve(t, a), wire.PingRequest()); res.ExitCode != 0 || res.Error != "" {
		t.Fatalf("ping: %s", dump(res))
	}
}

// TestIdleTrim checks that the agent returns its free memory once, a
// while after the last of calls back to back, and not while one runs.
func TestIdleTrim(t *testing.T) {
	t.Parallel()
	var trims atomic.Int32
	a := testAgent(t)
	a.freeOSMemory = func() { trims.Add(1) }
	start := time.Now()
	for range 3 {
		run(t, a, request(wire.LanguageShell, "true"))
	}
	res := run(t, a, request(wire.LanguageShell, "sleep 1.5"))
	if res.ExitCode != 0 {
		t.Fatalf("sleep: %s", dump(res))
	}
	if n := trims.Load(); n != 0 {
		t.Fatalf("%d trims while calls came or ran (%s)", n, time.Since(start))
	}
	waitUntil(t, "a trim", func() bool { return trims.Load() == 1 })
	time.Sleep(trimAfter + 200*time.Millisecond)
	if n := trims.Load(); n != 1 {
		t.Fatalf("%d trims after one idle period, want 1", n)
	}
}
