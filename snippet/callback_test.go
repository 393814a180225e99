package snippet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// toolServer is a host server of callbacks: it answers each line with
// "ok: LINE" and counts its connections and those that ended (EOF).
type toolServer struct {
	path        string
	conns, eofs atomic.Int32
}

func startToolServer(t *testing.T) *toolServer {
	t.Helper()
	s := &toolServer{path: filepath.Join(t.TempDir(), "tools.sock")}
	serveUnix(t, s.path, func(c net.Conn) {
		s.conns.Add(1)
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				s.eofs.Add(1)
				return
			}
			fmt.Fprintf(c, "ok: %s", line)
		}
	})
	return s
}

// callbackCall runs req on the agent at socket with its callbacks forwarded
// to the server at server (a refused dial if server is "").
func callbackCall(t *testing.T, socket, server string, req *wire.Request) *wire.Result {
	t.Helper()
	req.CallbackDial = func(ctx context.Context) (io.ReadWriteCloser, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", server)
	}
	return call(t, socket, req)
}

func callbackAgent(t *testing.T) (*Agent, string) {
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), CallbackDir: filepath.Join(t.TempDir(), "cb"), Spares: withSpares(t)}
	if a.Spares {
		warmUp(t, a)
	}
	return a, serve(t, a)
}

// talk is Python that connects n times to the callback socket, sends a line
// and prints the answer (or what went wrong).
const talk = `import os, socket
def talk(line, path=os.environ['FLMBOX_CALLBACK_SOCKET']):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(line.encode() + b'\n')
        s.shutdown(socket.SHUT_WR)
        got = b''
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
        return got.decode() or 'EOF'
    except OSError as e:
        return 'error %d' % e.errno
    finally:
        s.close()
`

// refusedOutput says whether out begins with what talk prints of a refused
// connection: EOF, or the errno of a send or receive on a socket closed
// under it (EPIPE, ECONNRESET).
func refusedOutput(out string) bool {
	return regexp.MustCompile(`^(EOF|error (32|104))`).MatchString(out)
}

func TestCallback(t *testing.T) {
	t.Parallel()
	srv := startToolServer(t)
	_, socket := callbackAgent(t)
	for _, lang := range []string{wire.LanguagePython, wire.LanguageShell} {
		t.Run(lang, func(t *testing.T) {
			code := talk + "print(talk('search x'), end='')\nprint(os.environ['HERMES_RPC_SOCKET'] == os.environ['FLMBOX_CALLBACK_SOCKET'])"
			if lang == wire.LanguageShell {
				code = `test "$HERMES_RPC_SOCKET" = "$FLMBOX_CALLBACK_SOCKET" && python3 -c "$(cat <<'EOF'
` + talk + `print(talk('search x'), end='')
EOF
)" && echo True`
			}
			res := callbackCall(t, socket, srv.path, request(lang, code, func(r *wire.Request) {
				r.Callback = &wire.Callback{Env: []string{"HERMES_RPC_SOCKET"}}
			}))
			if string(res.Stdout.Data) != "ok: search x\nTrue\n" || res.ExitCode != 0 {
				t.Fatalf("got %s", dump(res))
			}
			if c := res.Callbacks; c == nil || c.Connections != 1 || c.Refused != 0 || c.BytesOut != 9 || c.BytesIn != 13 {
				t.Fatalf("callbacks %+v", res.Callbacks)
			}
		})
	}
	// Eight connections at once: those that find no standby connection of
	// the client's wait for one to attach (wire.Event.Callback).
	code := talk + `import threading
out = [None] * 8
def one(i):
    out[i] = talk('%d' % i)
ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print(''.join(out), end='')`
	res := callbackCall(t, socket, srv.path, request(wire.LanguagePython, code, func(r *wire.Request) { r.Callback = &wire.Callback{} }))
	if want := "ok: 0\nok: 1\nok: 2\nok: 3\nok: 4\nok: 5\nok: 6\nok: 7\n"; string(res.Stdout.Data) != want || res.Callbacks.Connections != 8 {
		t.Fatalf("eight at once: %s, callbacks %+v", dump(res), res.Callbacks)
	}
	// The socket is gone after the call, and the next call has none.
	res = call(t, socket, request(wire.LanguageShell, `echo "[$FLMBOX_CALLBACK_SOCKET]"`))
	if string(res.Stdout.Data) != "[]\n" || res.Callbacks != nil {
		t.Fatalf("a call without a callback: %s", dump(res))
	}
}

func TestCallbackLimits(t *testing.T) {
	t.Parallel()
	srv := startToolServer(t)
	_, socket := callbackAgent(t)
	code := talk + "print([talk('%d' % i) for i in range(4)])"
	res := callbackCall(t, socket, srv.path, request(wire.LanguagePython, code, func(r *wire.Request) {
		r.Callback = &wire.Callback{MaxConns: 3}
	}))
	// Refused: closed at once (EOF, or ECONNRESET with the request unread).
	if out := string(res.Stdout.Data); !strings.HasPrefix(out, "['ok: 0\\n', 'ok: 1\\n', 'ok: 2\\n', '") || !refusedOutput(out[len("['ok: 0\\n', 'ok: 1\\n', 'ok: 2\\n', '"):]) {
		t.Fatalf("got %s", dump(res))
	}
	if c := res.Callbacks; c.Connections != 3 || c.Refused != 1 {
		t.Fatalf("callbacks %+v", c)
	}
	// Past MaxBytes, the connection is cut.
	code = talk + "print(talk('x' * 100))"
	res = callbackCall(t, socket, srv.path, request(wire.LanguagePython, code, func(r *wire.Request) {
		r.Callback = &wire.Callback{MaxBytes: 50}
	}))
	if string(res.Stdout.Data) != "EOF\n" || res.Callbacks.BytesOut != 50 || res.Callbacks.BytesIn != 0 {
		t.Fatalf("over the byte limit: %s, callbacks %+v", dump(res), res.Callbacks)
	}
	// MaxBytes is the call's, all connections and both ways together: the
	// first connection spends 11 + 15 bytes of 40, the second crosses the
	// budget and is cut, the third is refused.
	code = talk + "print([talk(c * 10) for c in 'xyz'])"
	res = callbackCall(t, socket, srv.path, request(wire.LanguagePython, code, func(r *wire.Request) {
		r.Callback = &wire.Callback{MaxBytes: 40}
	}))
	if c := res.Callbacks; !strings.HasPrefix(string(res.Stdout.Data), "['ok: xxxxxxxxxx\\n', '") || c.BytesIn+c.BytesOut != 40 || c.Connections != 2 || c.Refused != 1 {
		t.Fatalf("over the call's byte budget: %s, callbacks %+v", dump(res), res.Callbacks)
	}
	// Idle past the limit: cut.
	code = `import os, socket, time
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ['FLMBOX_CALLBACK_SOCKET'])
s.settimeout(30)
print(repr(s.recv(10)))`
	res = callbackCall(t, socket, srv.path, request(wire.LanguagePython, code, func(r *wire.Request) {
		r.Callback = &wire.Callback{IdleMS: 200}
	}))
	if string(res.Stdout.Data) != "b''\n" {
		t.Fatalf("an idle connection: %s", dump(res))
	}
	// A server that cannot be reached: refused.
	res = callbackCall(t, socket, filepath.Join(t.TempDir(), "none.sock"), request(wire.LanguagePython, talk+"print(talk('x'))", func(r *wire.Request) {
		r.Callback = &wire.Callback{}
	}))
	if !refusedOutput(string(res.Stdout.Data)) || res.Callbacks.Refused != 1 || res.Callbacks.Connections != 0 {
		t.Fatalf("no server: %s, callbacks %+v", dump(res), res.Callbacks)
	}
}

// TestCallbackEndsWithTheCall: a call that times out closes its forwarded
// connections (the server reads EOF) and removes its socket.
func TestCallbackEndsWithTheCall(t *testing.T) {
	t.Parallel()
	srv := startToolServer(t)
	a, socket := callbackAgent(t)
	code := `import os, socket, time
open(os.path.join(os.environ['HOME_DIR'], 'path'), 'w').write(os.environ['FLMBOX_CALLBACK_SOCKET'])
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ['FLMBOX_CALLBACK_SOCKET'])
s.sendall(b'hello\n')
s.recv(100)
time.sleep(100)`
	home := t.TempDir()
	res := callbackCall(t, socket, srv.path, request(wire.LanguagePython, code, func(r *wire.Request) {
		r.Callback, r.TimeoutMS, r.Env = &wire.Callback{}, 5000, []string{"HOME_DIR=" + home}
	}))
	if !res.TimedOut || res.Callbacks.Connections != 1 {
		t.Fatalf("got %s, callbacks %+v", dump(res), res.Callbacks)
	}
	waitUntil(t, "the server to read EOF", func() bool { return srv.eofs.Load() == 1 })
	path, err := os.ReadFile(filepath.Join(home, "path"))
	if err != nil || !strings.HasPrefix(string(path), a.CallbackDir) {
		t.Fatalf("the socket's path %q: %v", path, err)
	}
	if _, err := os.Lstat(string(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket is left after the call: %v", err)
	}
}

// TestCallbackOnlyTheCall: two calls at once each reach only their own
// server; a process of one call connecting to the other's socket is refused.
func TestCallbackOnlyTheCall(t *testing.T) {
	t.Parallel()
	_, socket := callbackAgent(t)
	one, two := startToolServer(t), startToolServer(t)
	dir := t.TempDir()
	code := talk + `import time
p = os.path.join(DIR, MINE)
open(p + '.tmp', 'w').write(os.environ['FLMBOX_CALLBACK_SOCKET'])
os.rename(p + '.tmp', p)
other = os.path.join(DIR, THEIRS)
while not os.path.exists(other):
    time.sleep(0.01)
print(talk('mine'), end='')
print(talk('theirs', open(other).read()))
open(p + '.done', 'w').close()
while not os.path.exists(other + '.done'):
    time.sleep(0.01)
`
	var wg sync.WaitGroup
	results := make([]*wire.Result, 2)
	for i, srv := range []*toolServer{one, two} {
		wg.Go(func() {
			code := strings.NewReplacer("DIR", fmt.Sprintf("%q", dir), "MINE", fmt.Sprintf("'%d'", i), "THEIRS", fmt.Sprintf("'%d'", 1-i)).Replace(code)
			results[i] = callbackCall(t, socket, srv.path, request(wire.LanguagePython, code, func(r *wire.Request) {
				r.Callback = &wire.Callback{}
			}))
		})
	}
	wg.Wait()
	for i, res := range results {
		if out := string(res.Stdout.Data); !strings.HasPrefix(out, "ok: mine\n") || !refusedOutput(out[len("ok: mine\n"):]) || res.Callbacks.Connections != 1 || res.Callbacks.Refused != 1 {
			t.Errorf("call %d: %s, callbacks %+v", i, dump(res), res.Callbacks)
		}
	}
	if one.conns.Load() != 1 || two.conns.Load() != 1 {
		t.Errorf("servers' connections: %d and %d, want 1 each", one.conns.Load(), two.conns.Load())
	}
}

// TestCallbackRefusedWithoutDir: an agent without a callback directory
// refuses a call with a callback, saying so; one whose directory others
// can write too refuses it as well.
func TestCallbackRefusedWithoutDir(t *testing.T) {
	t.Parallel()
	srv := startToolServer(t)
	a := &Agent{Python: hostPython(t), Dir: t.TempDir()}
	socket := serve(t, a)
	res := callbackCall(t, socket, srv.path, request(wire.LanguageShell, "echo ran", func(r *wire.Request) { r.Callback = &wire.Callback{} }))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "takes no callbacks") {
		t.Fatalf("got %s", dump(res))
	}
	open := t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	b := &Agent{Python: hostPython(t), Dir: t.TempDir(), CallbackDir: open}
	res = callbackCall(t, serve(t, b), srv.path, request(wire.LanguageShell, "echo ran", func(r *wire.Request) { r.Callback = &wire.Callback{} }))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "is not the agent's alone") {
		t.Fatalf("got %s", dump(res))
	}
}

// TestCallbackServerFirst: a server that speaks first reaches a snippet
// that sends nothing (its standby connection is woken without the
// snippet's bytes).
func TestCallbackServerFirst(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "banner.sock")
	serveUnix(t, path, func(c net.Conn) {
		fmt.Fprintf(c, "hello from the host\n")
		c.Close()
	})
	_, socket := callbackAgent(t)
	code := `import os, socket
for i in range(3):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ['FLMBOX_CALLBACK_SOCKET'])
    print(s.makefile().readline(), end='')
    s.close()`
	res := callbackCall(t, socket, path, request(wire.LanguagePython, code, func(r *wire.Request) { r.Callback = &wire.Callback{} }))
	if want := strings.Repeat("hello from the host\n", 3); string(res.Stdout.Data) != want || res.Callbacks.Connections != 3 {
		t.Fatalf("got %s, callbacks %+v", dump(res), res.Callbacks)
	}
}

// TestCallbackBackToBack: connections one after another, each closed by the
// server once it answered and then by the snippet, all get their answer
// and the server reads EOF on each, with framed standby connections (used
// again: far fewer attached than connections) and with an agent of before
// them (replaced as they are taken; a direction that ends last closes
// both). Not parallel: how many standbys are used again depends on how
// loaded the machine is.
func TestCallbackBackToBack(t *testing.T) {
	for _, framed := range []bool{true, false} {
		t.Run(fmt.Sprintf("framed=%v", framed), func(t *testing.T) { testCallbackBackToBack(t, framed) })
	}
}

func testCallbackBackToBack(t *testing.T, framed bool) {
	path := filepath.Join(t.TempDir(), "once.sock")
	var eofs atomic.Int32
	serveUnix(t, path, func(c net.Conn) {
		defer c.Close()
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return
		}
		fmt.Fprintf(c, "ok: %s", line)
		c.(*net.UnixConn).CloseWrite()
		if n, _ := c.Read(make([]byte, 1)); n == 0 {
			eofs.Add(1)
		}
	})
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), CallbackDir: filepath.Join(t.TempDir(), "cb"), noFrames: !framed}
	socket := serve(t, a)
	const n = 20
	code := fmt.Sprintf(`import os, socket
for i in range(%d):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ['FLMBOX_CALLBACK_SOCKET'])
    s.sendall(b'%%d\n' %% i)
    got = b''
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    print(got.decode(), end='')
    s.close()`, n)
	res := callbackCall(t, socket, path, request(wire.LanguagePython, code, func(r *wire.Request) { r.Callback = &wire.Callback{} }))
	var want strings.Builder
	for i := range n {
		fmt.Fprintf(&want, "ok: %d\n", i)
	}
	if string(res.Stdout.Data) != want.String() || res.Callbacks.Connections != n || res.Callbacks.Refused != 0 {
		t.Fatalf("got %s, callbacks %+v", dump(res), res.Callbacks)
	}
	// The last connection's server may read its EOF after the call ends.
	for deadline := time.Now().Add(5 * time.Second); eofs.Load() != n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := eofs.Load(); got != n {
		t.Fatalf("the server read EOF on %d connections, want %d", got, n)
	}
	// Framed, a standby is replaced only if it is cut or carries a
	// connection past 20 ms (a loaded test machine).
	if got := a.standbys.Load(); framed && got > n/2 || !framed && got < n {
		t.Fatalf("%d standby connections attached for %d connections", got, n)
	}
}

// TestCallbackOldAgent: an agent that ignores the request's callback (of
// before callbacks) fails the call, rather than running it without one.
func TestCallbackOldAgent(t *testing.T) {
	t.Parallel()
	socket := fakeAgent(t, fmt.Sprintf(`{"version": %d, "exit_code": 0, "stdout": {"data": ""}, "stderr": {"data": ""}}`, wire.ProtocolVersion))
	req := request(wire.LanguageShell, "true", func(r *wire.Request) {
		r.Callback = &wire.Callback{}
		r.CallbackDial = func(context.Context) (io.ReadWriteCloser, error) { return nil, errors.New("no") }
	})
	if _, err := wire.Call(context.Background(), socket, req); !errors.Is(err, wire.ErrProtocolVersion) {
		t.Fatalf("Call = %v, want wire.ErrProtocolVersion", err)
	}
}

// TestCallbackStuckWriteIsIdle: a snippet that stops reading while the
// server sends is cut after the idle time, not at the call's end.
func TestCallbackStuckWriteIsIdle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "flood.sock")
	serveUnix(t, path, func(c net.Conn) {
		defer c.Close()
		chunk := make([]byte, 64<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				os.WriteFile(filepath.Join(dir, "cut"), nil, 0o644) // the snippet waits for it
				return
			}
		}
	})
	_, socket := callbackAgent(t)
	code := `import os, socket, time
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ['FLMBOX_CALLBACK_SOCKET'])
s.sendall(b'x')
while not os.path.exists(DIR + '/cut'):
    time.sleep(0.01)
print('cut')`
	code = strings.ReplaceAll(code, "DIR", fmt.Sprintf("%q", dir))
	res := callbackCall(t, socket, path, request(wire.LanguagePython, code, func(r *wire.Request) {
		r.Callback = &wire.Callback{IdleMS: 200}
	}))
	if string(res.Stdout.Data) != "cut\n" || res.TimedOut {
		t.Fatalf("got %s, callbacks %+v", dump(res), res.Callbacks)
	}
}

// TestCallbackDirNotInCleanDirs: a callback directory that snippets could
// write to is refused.
func TestCallbackDirNotInCleanDirs(t *testing.T) {
	t.Parallel()
	srv := startToolServer(t)
	tmp := t.TempDir()
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), CleanDirs: []string{tmp}, CallbackDir: filepath.Join(tmp, "cb")}
	res := callbackCall(t, serve(t, a), srv.path, request(wire.LanguageShell, "echo ran", func(r *wire.Request) { r.Callback = &wire.Callback{} }))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "which snippets can write") {
		t.Fatalf("got %s", dump(res))
	}
}

// TestRawConn: a forwarded connection's raw reads and writes behave as
// package net's do: bytes, EOF, a deadline, a failed write, and a read
// that does not wait.
func TestRawConn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.DialUnix("unix", nil, ln.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	accepted, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	conn := rawIO(accepted)
	defer conn.Close()
	if _, ok := conn.(*rawConn); !ok {
		t.Fatalf("rawIO gave a %T, want a *rawConn", conn)
	}

	buf := make([]byte, 64)
	if _, _, ok := readNow(conn, buf); ok {
		t.Fatal("readNow read from an empty socket")
	}
	conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := conn.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read past its deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	conn.SetReadDeadline(time.Time{})

	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err, ok := readNow(conn, buf)
		if ok {
			if err != nil || string(buf[:n]) != "hello" {
				t.Fatalf("readNow: %q, %v; want \"hello\"", buf[:n], err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("readNow never read the peer's bytes")
		}
		time.Sleep(time.Millisecond)
	}

	big := make([]byte, 1<<20) // more than the socket buffers: the write waits for the reader
	go io.Copy(io.Discard, peer)
	if n, err := conn.Write(big); n != len(big) || err != nil {
		t.Fatalf("write: %d bytes, %v; want %d", n, err, len(big))
	}

	go func() {
		time.Sleep(10 * time.Millisecond)
		peer.CloseWrite()
	}()
	if n, err := conn.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("a read at the peer's EOF: %d, %v; want 0, io.EOF", n, err)
	}
	if n, err, ok := readNow(conn, buf); !ok || n != 0 || err != io.EOF {
		t.Fatalf("readNow at EOF: %d, %v, %v; want 0, io.EOF, true", n, err, ok)
	}

	// A write to a closed peer fails, at once or at the next, once the
	// peer's socket is released: a child that a test running in parallel
	// forks meanwhile holds it until its exec.
	peer.Close()
	var werr error
	for deadline := time.Now().Add(guard); werr == nil && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		_, werr = conn.Write([]byte("x"))
	}
	if werr == nil {
		t.Fatal("writes to a closed peer did not fail")
	}
	conn.Close()
	if _, err := conn.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a read of a closed connection: %v, want net.ErrClosed", err)
	}
}
