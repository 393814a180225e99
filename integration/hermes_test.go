//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Hermes Agent's execute_code, through flmbox run --callback, with a client
// and a server of Hermes' shape (not Hermes' code): the script imports a
// generated hermes_tools module next to it, whose functions send one JSON
// line each, {"tool", "args", "token"}, over ONE Unix socket connection
// that the module opens at its first call and keeps for the whole
// execution (a lock makes threads take turns), reading one JSON line back
// (recv(65536) until a newline; an empty recv raises "Agent process
// disconnected"). The socket's path is in HERMES_RPC_SOCKET, a fresh token
// per execution in HERMES_RPC_TOKEN. The server answers each line in turn,
// errors in-band ({"error"}), and allows 50 tool calls per execution; the
// execution may last 5 minutes. The script is run as a file (script.py).

// hermesTools is the generated module: Hermes' stub shape.
const hermesTools = `import json, os, socket, threading

_sock = None
_call_lock = threading.Lock()


def _connect():
    global _sock
    if _sock is None:
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _sock.connect(os.environ["HERMES_RPC_SOCKET"])
        _sock.settimeout(300)
    return _sock


def _call(tool_name, args):
    request = json.dumps({"tool": tool_name, "args": args, "token": os.environ.get("HERMES_RPC_TOKEN", "")}) + "\n"
    with _call_lock:
        conn = _connect()
        conn.sendall(request.encode())
        buf = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                raise RuntimeError("Agent process disconnected")
            buf += chunk
            if buf.endswith(b"\n"):
                break
    result = json.loads(buf.decode())
    if isinstance(result, str):
        try:
            return json.loads(result)
        except (json.JSONDecodeError, TypeError):
            return result
    return result


def read_file(path, offset=1, limit=2000):
    return _call("read_file", {"path": path, "offset": offset, "limit": limit})


def terminal(command, timeout=None, workdir=None):
    return _call("terminal", {"command": command, "timeout": timeout, "workdir": workdir})


def web_search(query, limit=5):
    return _call("web_search", {"query": query, "limit": limit})
`

// hermesServer is the agent's end of one execution: Hermes' RPC server loop
// shape, on the socket that flmbox run --callback names.
type hermesServer struct {
	path, token string
	maxCalls    int64
	calls       atomic.Int64 // tool calls dispatched
	conns       atomic.Int64
	ln          net.Listener
	wg          sync.WaitGroup
}

// hermesFileSize is the size of each read_file answer's content: 1 MB.
const hermesFileSize = 1_000_000

func startHermesServer(t *testing.T, token string) *hermesServer {
	t.Helper()
	s := &hermesServer{path: filepath.Join(shortDir(t), "hermes.sock"), token: token, maxCalls: 50}
	ln, err := net.Listen("unix", s.path)
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

// serve answers c's lines until EOF or 300 s of silence, as Hermes does.
func (s *hermesServer) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 65536)
	for {
		c.SetReadDeadline(time.Now().Add(300 * time.Second))
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		answer, _ := json.Marshal(s.answer(line))
		if _, err := c.Write(append(answer, '\n')); err != nil {
			return
		}
	}
}

// answer is the server's reply to one request line.
func (s *hermesServer) answer(line []byte) any {
	var req struct {
		Tool  string         `json:"tool"`
		Args  map[string]any `json:"args"`
		Token string         `json:"token"`
	}
	if err := json.Unmarshal(line, &req); err != nil {
		return map[string]string{"error": "Invalid RPC request: " + err.Error()}
	}
	if s.token == "" || subtle.ConstantTimeCompare([]byte(req.Token), []byte(s.token)) != 1 {
		return map[string]string{"error": "Unauthorized RPC request"}
	}
	if s.calls.Load() >= s.maxCalls {
		return map[string]string{"error": fmt.Sprintf("Tool call limit reached (%d). No more tool calls allowed in this execution.", s.maxCalls)}
	}
	s.calls.Add(1)
	switch req.Tool {
	case "read_file":
		path, _ := req.Args["path"].(string)
		// 1 MB of numbered lines, the last one cut to size, ending with the
		// path so that each answer is its own.
		var b strings.Builder
		for i := 1; b.Len() < hermesFileSize; i++ {
			fmt.Fprintf(&b, "%d|%s line %d\n", i, path, i)
		}
		content := b.String()[:hermesFileSize-len(path)] + path
		return map[string]any{"content": content, "total_lines": strings.Count(content, "\n") + 1, "file_size": len(content),
			"truncated": false, "is_binary": false, "is_image": false}
	case "terminal":
		cmd, _ := req.Args["command"].(string)
		var seconds int
		if _, err := fmt.Sscanf(cmd, "sleep %d", &seconds); err == nil {
			time.Sleep(time.Duration(seconds) * time.Second)
		}
		return map[string]any{"output": "ran " + cmd, "exit_code": 0}
	case "web_search":
		query, _ := req.Args["query"].(string)
		return map[string]any{"data": map[string]any{"web": []map[string]string{{"title": "about " + query, "url": "https://example.invalid/" + query}}}}
	}
	return map[string]string{"error": fmt.Sprintf("Tool '%s' is not available in execute_code. Available: read_file, terminal, web_search", req.Tool)}
}

// hermesExecute runs script as Hermes' execute_code would, through flmbox:
// script.py with hermes_tools.py next to it (copied into /tmp, the working
// directory), the server's socket as HERMES_RPC_SOCKET and a fresh token in
// HERMES_RPC_TOKEN (the server's), 5 minutes at most; where is --image REF
// or --sandbox NAME. It returns run --json's object.
func hermesExecute(t *testing.T, root string, srv *hermesServer, script string, where ...string) cbResult {
	t.Helper()
	return hermesExecuteToken(t, root, srv, srv.token, script, where...)
}

// hermesExecuteToken is hermesExecute with token in HERMES_RPC_TOKEN.
func hermesExecuteToken(t *testing.T, root string, srv *hermesServer, token, script string, where ...string) cbResult {
	t.Helper()
	return hermesStart(t, root, srv, token, script, where...)()
}

// hermesStart is hermesExecuteToken that returns at once, with a function
// that waits.
func hermesStart(t *testing.T, root string, srv *hermesServer, token, script string, where ...string) (wait func() cbResult) {
	t.Helper()
	dir := t.TempDir()
	tools, path := filepath.Join(dir, "hermes_tools.py"), filepath.Join(dir, "script.py")
	if err := os.WriteFile(tools, []byte(hermesTools), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(where, "--copy", tools+":/tmp/hermes_tools.py", "--callback", srv.path, "--callback-env", "HERMES_RPC_SOCKET",
		"-e", "HERMES_RPC_TOKEN="+token, "--timeout", "300s", path)
	return cbStart(t, root, 0, args...)
}

func TestHermesExecuteCode(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	image := []string{"--image", reg.digestRef()}

	// A tool that takes 65 s, and a script silent for 65 s between two
	// calls: the connection stays (no idle cut shorter than the call's
	// own timeout). They wait while the other cases run, and are checked
	// last.
	slowSrv := startHermesServer(t, "token-slow-tool")
	slowTool := hermesStart(t, root, slowSrv, slowSrv.token, `from hermes_tools import terminal, web_search
print(terminal("sleep 65")["output"], web_search("after")["data"]["web"][0]["title"])
`, image...)
	idleSrv := startHermesServer(t, "token-idle")
	idle := hermesStart(t, root, idleSrv, idleSrv.token, `import time
from hermes_tools import web_search
first = web_search("before")["data"]["web"][0]["title"]
time.sleep(65)
print(first, web_search("after")["data"]["web"][0]["title"])
`, image...)

	// One connection, 50 tool calls: 20 answers of 1 MB each (20 MB in
	// all), then 30 small ones; the 51st call is refused in-band by the
	// server's own limit, on the same connection.
	t.Run("50 calls, 20 MB of answers", func(t *testing.T) {
		srv := startHermesServer(t, "token-50-calls")
		res := hermesExecute(t, root, srv, `import sys
from hermes_tools import read_file, web_search
sizes = [len(read_file("/data/f%d.txt" % i)["content"]) for i in range(20)]
ok = all(s == 1_000_000 for s in sizes)
found = [web_search("q%d" % i)["data"]["web"][0]["title"] for i in range(30)]
last = web_search("one too many")
print(ok, len(sizes), found[-1], last.get("error", "").split(" (")[0], __file__.endswith("/script.py"), sys.argv[0] == __file__)
`, image...)
		if want := "True 20 about q29 Tool call limit reached True True\n"; res.Stdout != want || res.ExitCode != 0 {
			t.Errorf("exit %d, stdout %q (want %q), stderr %q", res.ExitCode, res.Stdout, want, res.Stderr)
		}
		if cb := res.Callbacks; cb == nil || cb.Connections != 1 || cb.Refused != 0 || cb.BytesIn < 20_000_000 {
			t.Errorf("callbacks %+v: want one connection that carried the 20 MB", res.Callbacks)
		}
		if n := srv.calls.Load(); n != 50 {
			t.Errorf("the server dispatched %d tool calls, want 50", n)
		}
	})

	// Eight threads share the one connection, taking turns under the
	// module's lock; each gets its own answers.
	t.Run("8 threads, one connection", func(t *testing.T) {
		srv := startHermesServer(t, "token-threads")
		res := hermesExecute(t, root, srv, `import threading
from hermes_tools import web_search
bad = []
def worker(n):
    for i in range(5):
        q = "t%d-%d" % (n, i)
        if web_search(q)["data"]["web"][0]["title"] != "about " + q:
            bad.append(q)
ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print(len(bad))
`, image...)
		if res.Stdout != "0\n" || res.ExitCode != 0 || res.Callbacks == nil || res.Callbacks.Connections != 1 || srv.calls.Load() != 40 {
			t.Errorf("exit %d, stdout %q, stderr %q, callbacks %+v, %d calls: want 40 calls answered right on one connection",
				res.ExitCode, res.Stdout, res.Stderr, res.Callbacks, srv.calls.Load())
		}
	})

	// In a persistent sandbox, each execution has its own token (its
	// call's environment, -e with --sandbox) and its own server; the
	// token of one never reaches the next, and a wrong one is refused.
	t.Run("a token per execution", func(t *testing.T) {
		createSandbox(t, root, reg, "hermes")
		script := `import os
from hermes_tools import web_search
print(os.environ["HERMES_RPC_TOKEN"], web_search("x").get("error", "ok"))
`
		for _, token := range []string{"first-token", "second-token"} {
			srv := startHermesServer(t, token)
			res := hermesExecute(t, root, srv, script, "--sandbox", "hermes")
			if want := token + " ok\n"; res.Stdout != want || res.ExitCode != 0 {
				t.Errorf("token %s: exit %d, stdout %q (want %q), stderr %q", token, res.ExitCode, res.Stdout, want, res.Stderr)
			}
		}
		srv := startHermesServer(t, "the-servers-token")
		res := hermesExecuteToken(t, root, srv, "first-token", script, "--sandbox", "hermes")
		if res.Stdout != "first-token Unauthorized RPC request\n" || srv.calls.Load() != 0 {
			t.Errorf("an earlier execution's token: stdout %q, stderr %q, %d calls dispatched", res.Stdout, res.Stderr, srv.calls.Load())
		}
		// The token set for a call is gone in the next call.
		out := flmbox(t, root, "run", "--sandbox", "hermes", "-c", `import os; print(os.environ.get("HERMES_RPC_TOKEN"))`)
		if out.stdout != "None\n" || out.code != 0 {
			t.Errorf("the next call sees HERMES_RPC_TOKEN: exit %d, stdout %q, stderr %q", out.code, out.stdout, out.stderr)
		}
	})

	if res := slowTool(); res.Stdout != "ran sleep 65 about after\n" || res.ExitCode != 0 || res.Callbacks == nil || res.Callbacks.Connections != 1 {
		t.Errorf("a tool of 65 s: exit %d, stdout %q, stderr %q, callbacks %+v", res.ExitCode, res.Stdout, res.Stderr, res.Callbacks)
	}
	if res := idle(); res.Stdout != "about before about after\n" || res.ExitCode != 0 || res.Callbacks == nil || res.Callbacks.Connections != 1 {
		t.Errorf("idle 65 s between calls: exit %d, stdout %q, stderr %q, callbacks %+v", res.ExitCode, res.Stdout, res.Stderr, res.Callbacks)
	}
}

// hostname is sandbox name's host name: the first 12 hex digits of its
// runsc ID (flmbox-HEX).
func hostname(t *testing.T, root, name string) string {
	t.Helper()
	return strings.TrimPrefix(sandboxID(t, root, name), "flmbox-")[:12]
}

// TestRunInputs: what a client such as Hermes' execute_code gives a call
// besides its code, in a persistent sandbox and in a pooled one: its stdin
// (-i), a directory copied in before the code runs (--copy), the call's
// own environment (-e, gone in the next call), and the code as a file.
func TestRunInputs(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "inputs")
	mustFlmbox(t, root, "pool", "fill", reg.digestRef(), "--size", "1")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pkg", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pkg", "sub", "mod.py"), []byte("VALUE = 42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "job.py")
	if err := os.WriteFile(script, []byte(`import os, sys
sys.path.insert(0, "/tmp/pkg")
from sub.mod import VALUE
print(sys.stdin.read().upper(), VALUE, os.environ.get("JOB_TOKEN"), os.path.basename(__file__), os.uname().nodename)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var pools []struct{ Idle []string }
	if err := json.Unmarshal([]byte(mustFlmbox(t, root, "pool", "ls", "--json")), &pools); err != nil || len(pools) != 1 || len(pools[0].Idle) != 1 {
		t.Fatalf("pool ls: %+v, %v", pools, err)
	}
	hostnames := map[string]string{ // the sandbox's, by where
		"--sandbox": hostname(t, root, "inputs"),
		"--image":   hostname(t, root, pools[0].Idle[0]), // -e is the call's: the pooled sandbox is taken
	}
	for _, where := range [][]string{{"--sandbox", "inputs"}, {"--image", reg.digestRef()}} {
		res := flmboxWithin(t, time.Minute, root, []byte("from stdin"), append(append([]string{"run"}, where...), "-i", "--copy", filepath.Join(dir, "pkg")+":/tmp/pkg",
			"-e", "JOB_TOKEN=t1", script)...)
		if want := "FROM STDIN 42 t1 job.py " + hostnames[where[0]] + "\n"; res.stdout != want || res.code != 0 {
			t.Errorf("%v: exit %d, stdout %q (want %q), stderr %q", where, res.code, res.stdout, want, res.stderr)
		}
	}
	// The call's environment and stdin are gone in the next call; the copy
	// stays in the persistent sandbox.
	res := runIn(t, root, "inputs", `import os, sys; print(os.environ.get("JOB_TOKEN"), repr(sys.stdin.read()), os.path.exists("/tmp/pkg/sub/mod.py"))`)
	if want := "None '' True\n"; res.stdout != want || res.code != 0 {
		t.Errorf("the next call: exit %d, stdout %q (want %q), stderr %q", res.code, res.stdout, want, res.stderr)
	}
}
