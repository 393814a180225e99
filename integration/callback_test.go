//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Callbacks (flmbox run --callback HOST_SOCKET) through the CLI, on the
// real runsc: the snippet's connections to the socket that
// FLMBOX_CALLBACK_SOCKET names reach a server of the test's on the host,
// within the call's limits, for the length of the call, and nothing else
// of the host is reachable.

// cbStats is run --json's "callbacks".
type cbStats struct {
	Connections int   `json:"connections"`
	Refused     int   `json:"refused"`
	BytesIn     int64 `json:"bytes_in"`
	BytesOut    int64 `json:"bytes_out"`
}

// cbResult is what these tests read of run --json's object and of a batch
// element.
type cbResult struct {
	ExitCode  int      `json:"exit_code"`
	Stdout    string   `json:"stdout"`
	Stderr    string   `json:"stderr"`
	TimedOut  bool     `json:"timed_out"`
	Callbacks *cbStats `json:"callbacks"`
}

// cbRun runs flmbox run --json ARGS and decodes its object; it fails the
// test unless flmbox exits with code.
func cbRun(t *testing.T, root string, code int, args ...string) cbResult {
	t.Helper()
	return cbStart(t, root, code, args...)()
}

// cbStart is cbRun that returns at once, with a function that waits.
func cbStart(t *testing.T, root string, code int, args ...string) (wait func() cbResult) {
	t.Helper()
	run := startFlmbox(t, root, append([]string{"run", "--json"}, args...)...)
	return func() cbResult {
		t.Helper()
		res := run()
		var out cbResult
		if err := json.Unmarshal([]byte(res.stdout), &out); err != nil || res.code != code {
			t.Fatalf("flmbox run %v: exit %d (want %d), %v\nstdout: %s\nstderr: %s", args, res.code, code, err, res.stdout, res.stderr)
		}
		return out
	}
}

// refused says whether call() returned what a snippet sees of a
// connection closed at once: EOF, or a reset or broken pipe if it had sent
// bytes.
func refused(got string) bool {
	return got == "EOF" || got == "ECONNRESET" || got == "EPIPE"
}

// shortDir is a new directory with a short path (a socket's path has at
// most 107 bytes), removed when the test ends.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// toolServer is a host server on a Unix socket that does what the first
// byte of each connection asks:
//
//	l  read a line, answer "ok NAME\n" and close
//	o  read to the end, record how many bytes came (the 'o' included)
//	i  write bigIn bytes, then close
//	h  read to the end (or an error): record an end
type toolServer struct {
	path, name string
	ln         net.Listener
	conns      atomic.Int64
	received   chan int64 // per 'o' connection
	ends       chan error // per 'h' connection: nil for EOF
	wg         sync.WaitGroup
	mu         sync.Mutex
	open       map[net.Conn]bool
}

// bigIn is what an 'i' connection writes: past the 16 MiB budget the tests set.
const bigIn = 16<<20 + 1

func startToolServer(t *testing.T, path, name string) *toolServer {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := &toolServer{path: path, name: name, ln: ln, received: make(chan int64, 64), ends: make(chan error, 64), open: map[net.Conn]bool{}}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			s.mu.Lock()
			s.open[c] = true
			s.mu.Unlock()
			s.wg.Go(func() {
				defer func() {
					c.Close()
					s.mu.Lock()
					delete(s.open, c)
					s.mu.Unlock()
				}()
				s.serve(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *toolServer) serve(c net.Conn) {
	r := bufio.NewReader(c)
	op, err := r.ReadByte()
	if err != nil {
		return
	}
	switch op {
	case 'l':
		if _, err := r.ReadString('\n'); err == nil {
			fmt.Fprintf(c, "ok %s\n", s.name)
		}
	case 'o':
		n, _ := io.Copy(io.Discard, r)
		s.received <- n + 1
	case 'i':
		c.Write(make([]byte, bigIn))
	case 'h':
		_, err := io.Copy(io.Discard, r)
		s.ends <- err
	}
}

// cbPrelude is Python that the snippets share: call(PATH, DATA) connects
// to the Unix socket PATH, sends DATA, ends its side, and returns what came
// back, "EOF" if nothing did, or the errno's name of a failure.
const cbPrelude = `import errno, os, socket, sys, time
def err(e):
    return errno.errorcode.get(e.errno, str(e))
def call(path, data=b"l ping\n"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(1 << 16):
            out += chunk
        return out.decode() or "EOF"
    except OSError as e:
        return err(e)
    finally:
        s.close()
CB = os.environ.get("FLMBOX_CALLBACK_SOCKET")
`

// TestCallbackDemo3 is make demo's demo 3: the toolserver built here, demo3.py
// in a fresh --network none sandbox, 20 tool calls.
func TestCallbackDemo3(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	bin := filepath.Join(t.TempDir(), "toolserver")
	if out, err := exec.Command("go", "build", "-o", bin, "../internal/testrig/cmd/toolserver").CombinedOutput(); err != nil {
		t.Fatalf("build the toolserver: %v\n%s", err, out)
	}
	sock := filepath.Join(shortDir(t), "tools.sock")
	ts := exec.Command(bin, "-listen", sock)
	var out syncBuffer
	ts.Stdout, ts.Stderr = &out, &out
	if err := ts.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ts.Process.Kill(); ts.Wait() })
	pollUntil(t, 30*time.Second, "the toolserver listens", func() bool {
		return strings.HasPrefix(out.String(), "toolserver: listening on "+sock+"\n")
	})
	res := flmbox(t, root, "run", "--image", reg.digestRef(), "--network", "none", "--callback", sock,
		"--callback-env", "HERMES_RPC_SOCKET", "../demo/demo3.py")
	if want := "warmest of 10 cities: Hanoi, 29 C, sunny; top result: https://wiki.example/hanoi-travel (20 tool calls)\n"; res.code != 0 || res.stdout != want || res.stderr != "" {
		t.Errorf("demo 3: exit %d\nstdout: %q, want %q\nstderr: %s", res.code, res.stdout, want, res.stderr)
	}
	ts.Process.Signal(syscall.SIGTERM)
	if err := ts.Wait(); err != nil {
		t.Errorf("the toolserver: %v\n%s", err, out.String())
	}
	if !strings.HasSuffix(out.String(), "toolserver: served 20 calls (search 10, weather 10), 0 errors\n") {
		t.Errorf("the toolserver printed %q", out.String())
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the toolserver's socket is left: %v", err)
	}
}

// TestCallbackLimits: in one persistent sandbox, 50 connections are
// forwarded and the 51st is closed at once (the snippet reads EOF, the
// result counts it, plain mode says so); under --callback-bytes 16MiB, a
// 16 MiB + 1 stream is cut at the call's 16 MiB, both ways counted
// together; an idle connection is closed under --callback-idle (never by
// default: TestHermesExecuteCode); a call that times out
// closes its forwarded connections; the next call without --callback has
// neither the socket nor the variable.
func TestCallbackLimits(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "cb")
	srv := startToolServer(t, filepath.Join(shortDir(t), "tools.sock"), "host")

	t.Run("51 connections", func(t *testing.T) {
		code := cbPrelude + `
answers = [call(CB) for _ in range(51)]
print(sum(a == "ok host\n" for a in answers), answers[-1].strip())
`
		before := srv.conns.Load()
		res := cbRun(t, root, 0, "--sandbox", "cb", "--callback", srv.path, "-c", code)
		t.Logf("answers, the 51st: %s", strings.TrimSpace(res.Stdout))
		if n, last, _ := strings.Cut(strings.TrimSpace(res.Stdout), " "); n != "50" || !refused(last) {
			t.Errorf("stdout %q stderr %q: want 50 answers and the 51st refused", res.Stdout, res.Stderr)
		}
		if res.Callbacks == nil || res.Callbacks.Connections != 50 || res.Callbacks.Refused != 1 {
			t.Errorf("callbacks %+v: want 50 connections, 1 refused", res.Callbacks)
		}
		if n := srv.conns.Load() - before; n != 50 {
			t.Errorf("the host's server had %d connections, want 50", n)
		}
		// Plain mode says so on stderr, under a lower limit.
		plain := flmbox(t, root, "run", "--sandbox", "cb", "--callback", srv.path, "--callback-conns", "2", "-c", cbPrelude+`print(*[call(CB).strip().replace(" ", "_") for _ in range(3)])`)
		answers := strings.Fields(plain.stdout)
		if plain.code != 0 || len(answers) != 3 || answers[0] != "ok_host" || answers[1] != "ok_host" || !refused(answers[2]) ||
			plain.stderr != "flmbox: 1 callback connection refused: over the limit of 2 per call (--callback-conns)\n" {
			t.Errorf("--callback-conns 2, three connections: exit %d, stdout %q, stderr %q", plain.code, plain.stdout, plain.stderr)
		}
	})

	t.Run("16 MiB + 1", func(t *testing.T) {
		// The call lasts until the host's server has had the stream (the
		// test then makes /tmp/received): a call's end closes its forwarded
		// connections with what they still carry, and a busy host may not
		// have passed the cut stream's last bytes on when the snippet exits.
		code := cbPrelude + `
r = call(CB, b"o" + bytes(16 << 20))
deadline = time.time() + 60
while not os.path.exists("/tmp/received") and time.time() < deadline:
    time.sleep(0.01)
print(r)`
		done := make(chan result, 1)
		go func() {
			done <- flmbox(t, root, "run", "--json", "--sandbox", "cb", "--callback", srv.path, "--callback-bytes", "16MiB", "-c", code)
		}()
		select {
		case n := <-srv.received:
			if n != 16<<20 {
				t.Errorf("the host received %d bytes, want 16 MiB", n)
			}
		case <-time.After(60 * time.Second):
			t.Error("the host's server never saw the stream end")
		}
		mustFlmbox(t, root, "run", "--sandbox", "cb", "-l", "shell", "-c", "touch /tmp/received")
		run := <-done
		mustFlmbox(t, root, "run", "--sandbox", "cb", "-l", "shell", "-c", "rm /tmp/received")
		var res cbResult
		if err := json.Unmarshal([]byte(run.stdout), &res); err != nil || run.code != 0 {
			t.Fatalf("the 16 MiB + 1 call: exit %d, %v\nstdout: %s\nstderr: %s", run.code, err, run.stdout, run.stderr)
		}
		if !refused(strings.TrimSpace(res.Stdout)) {
			t.Errorf("stdout %q stderr %q: want the stream cut", res.Stdout, res.Stderr)
		}
		if res.Callbacks == nil || *res.Callbacks != (cbStats{Connections: 1, BytesOut: 16 << 20}) {
			t.Errorf("callbacks %+v: want 1 connection, bytes_out 16 MiB exactly", res.Callbacks)
		}
		// The other way: the snippet sends 1 byte, reads 16 MiB - 1 (the
		// call's budget), then EOF.
		code = cbPrelude + `
s = socket.socket(socket.AF_UNIX)
s.connect(CB)
s.sendall(b"i")
n = 0
try:
    while chunk := s.recv(1 << 16):
        n += len(chunk)
except OSError as e:
    print(err(e))
print(n)
`
		res = cbRun(t, root, 0, "--sandbox", "cb", "--callback", srv.path, "--callback-bytes", "16MiB", "-c", code)
		if res.Stdout != fmt.Sprintln(16<<20-1) || res.Callbacks == nil || *res.Callbacks != (cbStats{Connections: 1, BytesOut: 1, BytesIn: 16<<20 - 1}) {
			t.Errorf("stdout %q stderr %q callbacks %+v: want 16 MiB - 1 in exactly", res.Stdout, res.Stderr, res.Callbacks)
		}
	})

	t.Run("idle", func(t *testing.T) {
		// Nothing either way: the connection is closed (else the call
		// would time out, exit 124).
		code := cbPrelude + `
s = socket.socket(socket.AF_UNIX)
s.connect(CB)
s.sendall(b"h")
try:
    print(s.recv(1) or "EOF")
except OSError as e:
    print(err(e))
`
		res := cbRun(t, root, 0, "--sandbox", "cb", "--callback", srv.path, "--callback-idle", "500ms", "-c", code)
		if !refused(strings.TrimSpace(res.Stdout)) {
			t.Errorf("stdout %q stderr %q: want the idle connection closed", res.Stdout, res.Stderr)
		}
		select {
		case err := <-srv.ends:
			if err != nil {
				t.Logf("the host's end: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the host's server never saw the idle connection end")
		}
	})

	var inside string // the socket's path in the timed-out call
	t.Run("timeout", func(t *testing.T) {
		code := cbPrelude + `
s = socket.socket(socket.AF_UNIX)
s.connect(CB)
s.sendall(b"h")
print(CB, flush=True)
time.sleep(600)
`
		res := cbRun(t, root, 124, "--sandbox", "cb", "--callback", srv.path, "--callback-env", "HERMES_RPC_SOCKET", "--timeout", "3s", "-c", code)
		inside = strings.TrimSpace(res.Stdout)
		if !res.TimedOut || !strings.HasPrefix(inside, "/dev/.flmbox/callbacks/") || res.Callbacks == nil || res.Callbacks.Connections != 1 {
			t.Errorf("%+v: want a timeout, the socket's path, one connection", res)
		}
		select {
		case err := <-srv.ends:
			if err != nil {
				t.Logf("the host's end: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the host's server never saw the connection of the timed-out call end")
		}
	})

	t.Run("next call", func(t *testing.T) {
		code := fmt.Sprintf(`import os
print(os.environ.get("FLMBOX_CALLBACK_SOCKET"), os.environ.get("HERMES_RPC_SOCKET"), os.path.lexists(%q), os.listdir("/dev/.flmbox/callbacks"))`, inside)
		if out := mustFlmbox(t, root, "run", "--sandbox", "cb", "-c", code); out != "None None False []\n" {
			t.Errorf("the next call without --callback: %q, want no variable, no socket", out)
		}
	})
}

// TestCallbackConcurrentCalls: two calls at once in one sandbox, each with
// its own host socket, reach only their own: a connection to the other
// call's socket is closed at once and reaches no host server.
func TestCallbackConcurrentCalls(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "cb2")
	dir := shortDir(t)
	srvs := map[string]*toolServer{"a": startToolServer(t, filepath.Join(dir, "a.sock"), "a"), "b": startToolServer(t, filepath.Join(dir, "b.sock"), "b")}
	// Each call waits for the other at two barriers, so that both sockets
	// exist while each tries the other's.
	code := func(me, other string) string {
		return cbPrelude + fmt.Sprintf(`
def barrier(name):
    open("/tmp/" + name + "-%[1]s", "w").close()
    deadline = time.time() + 120
    while not os.path.exists("/tmp/" + name + "-%[2]s"):
        if time.time() > deadline:
            sys.exit("the other call never came")
        time.sleep(0.02)
barrier("ready")
mine = call(CB).strip().replace(" ", "_")
d = os.path.dirname(CB)
others = [call(os.path.join(d, f)) for f in os.listdir(d) if os.path.join(d, f) != CB]
barrier("done")
print(mine, *others)
`, me, other)
	}
	runs := map[string]result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for me, other := range map[string]string{"a": "b", "b": "a"} {
		wg.Go(func() {
			res := flmbox(t, root, "run", "--json", "--sandbox", "cb2", "--callback", srvs[me].path, "--timeout", "3m", "-c", code(me, other))
			mu.Lock()
			runs[me] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	for name, run := range runs {
		var res cbResult
		if err := json.Unmarshal([]byte(run.stdout), &res); err != nil || run.code != 0 {
			t.Fatalf("call %s: exit %d, %v\nstdout: %s\nstderr: %s", name, run.code, err, run.stdout, run.stderr)
		}
		// The other call's socket: closed at once, counted as refused by
		// the call it belongs to.
		t.Logf("call %s: %s", name, strings.TrimSpace(res.Stdout))
		if got := strings.Fields(res.Stdout); len(got) != 2 || got[0] != "ok_"+name || !refused(got[1]) {
			t.Errorf("call %s: stdout %q stderr %q: want its own server's answer and the other's socket refused", name, res.Stdout, res.Stderr)
		}
		if res.Callbacks == nil || res.Callbacks.Connections != 1 || res.Callbacks.Refused != 1 {
			t.Errorf("call %s: callbacks %+v: want 1 connection, 1 refused (the other call's)", name, res.Callbacks)
		}
		if n := srvs[name].conns.Load(); n != 1 {
			t.Errorf("server %s had %d connections, want 1", name, n)
		}
	}
}

// TestCallbackReachesNothingElse: with --network none, what a callback
// opens is only HOST_SOCKET: the host's loopback TCP, another host Unix
// socket by its path, and a host abstract socket are all unreachable
// inside, in the same call as a working callback.
func TestCallbackReachesNothingElse(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	dir := shortDir(t)
	srv := startToolServer(t, filepath.Join(dir, "tools.sock"), "host")
	var accepted atomic.Int64
	listen := func(network, addr string) net.Listener {
		ln, err := net.Listen(network, addr)
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
				accepted.Add(1)
				c.Write([]byte("host\n"))
				c.Close()
			}
		}()
		return ln
	}
	tcp := listen("tcp", "127.0.0.1:0")
	other := listen("unix", filepath.Join(dir, "other.sock"))
	abstract := listen("unix", fmt.Sprintf("@flmbox-test-%d", os.Getpid()))
	code := cbPrelude + fmt.Sprintf(`
def tcp(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=60).recv(5)
        return "reached"
    except OSError as e:
        return err(e)
print("callback", call(CB).strip())
print("tcp", tcp(%d))
print("unix", call(%q))
print("abstract", call("\0" + %q))
`, tcp.Addr().(*net.TCPAddr).Port, other.Addr().String(), strings.TrimPrefix(abstract.Addr().String(), "@"))
	res := cbRun(t, root, 0, "--image", reg.digestRef(), "--network", "none", "--callback", srv.path, "-c", code)
	t.Logf("inside:\n%s", res.Stdout)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 4 || lines[0] != "callback ok host" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	for _, l := range lines[1:] {
		what, got, _ := strings.Cut(l, " ")
		if !strings.HasPrefix(got, "E") { // an errno's name: the connection failed
			t.Errorf("%s: %q, want the connection to fail", what, got)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's other listeners accepted %d connections", n)
	}
	if res.Callbacks == nil || res.Callbacks.Connections != 1 || res.Callbacks.Refused != 0 || srv.conns.Load() != 1 {
		t.Errorf("callbacks %+v, host server %d connections: want one", res.Callbacks, srv.conns.Load())
	}
}

// TestCallbackSocketCannotBeReplaced: the snippet can neither remove,
// rename nor replace the call's socket (its directory is the agent's), and
// a socket of its own, named in the variable, reaches nothing of the host.
func TestCallbackSocketCannotBeReplaced(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	srv := startToolServer(t, filepath.Join(shortDir(t), "tools.sock"), "host")
	code := cbPrelude + fmt.Sprintf(`
import subprocess
d = os.path.dirname(CB)
open("/tmp/x", "w").close()
def try_(what, f):
    try:
        f()
        print(what, "done")
    except OSError as e:
        print(what, err(e))
try_("unlink", lambda: os.unlink(CB))
try_("rename", lambda: os.rename(CB, d + "/moved.sock"))
try_("symlink", lambda: os.symlink(%[1]q, d + "/evil.sock"))
try_("create", lambda: open(d + "/new", "w"))
try_("rename-dir", lambda: os.rename(d, d + "2"))
try_("chmod", lambda: os.chmod(d, 0o777))
def bind_in_dir():
    s = socket.socket(socket.AF_UNIX)
    s.bind(d + "/own.sock")
try_("bind", bind_in_dir)
for cmd in (["rm", "-f", CB], ["ln", "-sf", "/tmp/own.sock", CB], ["mv", "-f", "/tmp/x", CB]):
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(cmd[0], p.returncode, "Permission denied" in p.stderr or "Operation not permitted" in p.stderr)
# A socket of its own, named in the variable: it reaches only itself.
own = socket.socket(socket.AF_UNIX)
own.bind("/tmp/own.sock")
own.listen()
os.environ["FLMBOX_CALLBACK_SOCKET"] = "/tmp/own.sock"
c = socket.socket(socket.AF_UNIX)
c.connect(os.environ["FLMBOX_CALLBACK_SOCKET"])
peer, _ = own.accept()
peer.sendall(b"self\n")
print("own", c.recv(5).decode().strip())
# The host's socket by its host path, through a symlink of its own.
os.symlink(%[1]q, "/tmp/link.sock")
print("link", call("/tmp/link.sock"))
print("callback", call(CB).strip(), sorted(os.listdir(d)) == [os.path.basename(CB)])
`, srv.path)
	res := cbRun(t, root, 0, "--image", reg.digestRef(), "--callback", srv.path, "-c", code)
	t.Logf("inside:\n%s", res.Stdout)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 13 {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	for _, l := range lines[:7] {
		if what, got, _ := strings.Cut(l, " "); got != "EACCES" && got != "EPERM" {
			t.Errorf("%s: %s, want EACCES or EPERM", what, got)
		}
	}
	for _, l := range lines[7:10] {
		if !strings.HasSuffix(l, " 1 True") {
			t.Errorf("%q: want the command refused with a permission error", l)
		}
	}
	if want := []string{"own self", "link ENOENT", "callback ok host True"}; strings.Join(lines[10:], "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q, want %q", lines[10:], want)
	}
	if res.Callbacks == nil || res.Callbacks.Connections != 1 || srv.conns.Load() != 1 {
		t.Errorf("callbacks %+v, host server %d connections: want one, the call's own", res.Callbacks, srv.conns.Load())
	}
}

// TestCallbackRefusedBeforeRunning: HOST_SOCKET missing or not a socket
// fails with exit 125 before anything runs: no sandbox is made.
func TestCallbackRefusedBeforeRunning(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	dir := shortDir(t)
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	batch := filepath.Join(dir, "batch.json")
	if err := os.WriteFile(batch, []byte(`{"codes": ["print(1)"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sock := range []string{filepath.Join(dir, "nosuch.sock"), file, dir} {
		for _, args := range [][]string{{"-c", "print(1)"}, {"--batch", batch}} {
			res := flmbox(t, root, append([]string{"run", "--image", reg.digestRef(), "--callback", sock}, args...)...)
			if res.code != 125 || res.stdout != "" || !strings.Contains(res.stderr, "flmbox: callback socket") || !strings.Contains(res.stderr, "start it first, or fix the path") {
				t.Errorf("--callback %s %v: exit %d, stdout %q, stderr %q", sock, args, res.code, res.stdout, res.stderr)
			}
		}
	}
	if out := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("sandbox ls: %s, want no sandbox", out)
	}
}

// TestCallbackBatch: with --batch --image, each snippet has its own
// forwarding, to the same host socket, under --callback-env's name too.
func TestCallbackBatch(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	srv := startToolServer(t, filepath.Join(shortDir(t), "tools.sock"), "host")
	snippet := cbPrelude + `print(call(os.environ["HERMES_RPC_SOCKET"]).strip(), os.environ["HERMES_RPC_SOCKET"] == CB)`
	in, _ := json.Marshal(map[string]any{"codes": []string{snippet, snippet}})
	p := filepath.Join(t.TempDir(), "batch.json")
	if err := os.WriteFile(p, in, 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustFlmbox(t, root, "run", "--batch", p, "--image", reg.digestRef(), "--parallel", "2",
		"--callback", srv.path, "--callback-env", "HERMES_RPC_SOCKET")
	var results []cbResult
	if err := json.Unmarshal([]byte(out), &results); err != nil || len(results) != 2 {
		t.Fatalf("batch printed %q: %v", out, err)
	}
	for i, r := range results {
		if r.ExitCode != 0 || r.Stdout != "ok host True\n" || r.Callbacks == nil || r.Callbacks.Connections != 1 || r.Callbacks.Refused != 0 {
			t.Errorf("snippet %d: %+v (callbacks %+v)", i, r, r.Callbacks)
		}
	}
	if n := srv.conns.Load(); n != 2 {
		t.Errorf("the host's server had %d connections, want 2", n)
	}
}
