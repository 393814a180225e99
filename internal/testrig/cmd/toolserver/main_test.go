package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs main instead of the tests in a child that TestDemo3 starts
// (TOOLSERVER_MAIN=1): the command as built, signals included.
func TestMain(m *testing.M) {
	if os.Getenv("TOOLSERVER_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestRunUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		err  string
	}{
		{nil, "no socket to listen on: give -listen PATH"},
		{[]string{"-listen", "/x", "more"}, `unexpected arguments: ["more"]`},
		{[]string{"-listen", "/x", "-timeout", "0s"}, "-max-request and -timeout must be positive"},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), tt.args, &out, &out); err == nil || err.Error() != tt.err {
			t.Errorf("run %q: error %v, want %q", tt.args, err, tt.err)
		}
	}
}

// run serves until its context is done, then prints its summary.
func TestRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, w := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", path}, w, &stderr)
		w.Close()
	}()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "toolserver: listening on "+path {
		t.Fatalf("first line %q, want the ready line", lines.Text())
	}
	roundTrip(t, path, `{"tool": "weather", "args": {"city": "Lima"}}`+"\n", false)
	roundTrip(t, path, `{"tool": "nope"}`+"\n", false)
	cancel()
	if !lines.Scan() || lines.Text() != "toolserver: served 1 call (search 0, weather 1), 1 error" {
		t.Errorf("last line %q, want the summary", lines.Text())
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := stderr.String(), "toolserver: unknown tool \"nope\" (known: search, weather)\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket is still there (%v)", err)
	}
}

// demo3 is demo 3's snippet, from this package's directory.
const demo3 = "../../../../demo/demo3.py"

// The line demo/demo3.py prints against this server.
const demo3Line = "warmest of 10 cities: Hanoi, 29 C, sunny; top result: https://wiki.example/hanoi-travel (20 tool calls)\n"

// TestDemo3 runs demo 3's two ends against each other on the host, without
// flmbox: this command (as a process, stopped by SIGTERM) and demo/demo3.py
// under the host's python3, which must be there.
func TestDemo3(t *testing.T) {
	python := lookPython(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "s")
	server := exec.Command(os.Args[0], "-listen", path)
	server.Env = append(os.Environ(), "TOOLSERVER_MAIN=1")
	var stderr bytes.Buffer
	server.Stderr = &stderr
	stdout, err := server.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer server.Process.Kill()
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		for s := bufio.NewScanner(stdout); s.Scan(); {
			lines <- s.Text()
		}
	}()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("no line from the tool server within 30s; stderr: %s", stderr.String())
		}
		return ""
	}
	if l := next(); l != "toolserver: listening on "+path {
		t.Fatalf("first line %q, want the ready line; stderr: %s", l, stderr.String())
	}

	env := []string{"HERMES_RPC_SOCKET=" + path, "DEMO3_DIR=" + dir}
	out, errOut, err := runPython(t, python, "", env, demo3)
	if err != nil || out != demo3Line || errOut != "" {
		t.Fatalf("demo3.py: %v\nstdout %q\nwant %q\nstderr: %s", err, out, demo3Line, errOut)
	}
	// The stub demo3.py wrote raises on an error answer.
	_, errOut, err = runPython(t, python, dir, env, "-c", "import hermes_tools; hermes_tools.search(' ')")
	if want := `RuntimeError: tool search failed: search: bad args: "query" must be a non-empty string`; err == nil || !strings.Contains(errOut, want) {
		t.Errorf("an error answer: %v, stderr %q, want it to say %q", err, errOut, want)
	}

	if err := server.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if l := next(); l != "toolserver: served 20 calls (search 10, weather 10), 1 error" {
		t.Errorf("last line %q, want the summary", l)
	}
	if err := server.Wait(); err != nil {
		t.Errorf("the tool server after SIGTERM: %v; stderr: %s", err, stderr.String())
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket is still there (%v)", err)
	}
}

// A connection closed without an answer (as flmbox closes a call's 51st),
// at once or once the request is read, is a clear error in demo3.py's stub.
func TestDemo3Refused(t *testing.T) {
	python := lookPython(t)
	for _, read := range []bool{false, true} {
		t.Run(fmt.Sprint("read ", read), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "s")
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					if read {
						c.SetReadDeadline(time.Now().Add(10 * time.Second))
						bufio.NewReader(c).ReadString('\n')
					}
					c.Close()
				}
			}()
			_, errOut, err := runPython(t, python, "", []string{"HERMES_RPC_SOCKET=" + path, "DEMO3_DIR=" + dir}, demo3)
			want := "RuntimeError: tool call refused: the connection closed without an answer"
			if err == nil || !strings.Contains(errOut, want) {
				t.Errorf("demo3.py: %v, stderr %q, want it to say %q", err, errOut, want)
			}
		})
	}
}

// lookPython finds the host's python3; the demo's tests fail without it.
func lookPython(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("demo 3's host tests need python3 (3.11 or later) on PATH: %v", err)
	}
	return python
}

// runPython runs python3 with args, in dir unless "", with env added to the
// test's, for at most a minute.
func runPython(t *testing.T, python, dir string, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if ctx.Err() != nil {
		err = errors.Join(err, fmt.Errorf("python3 %q did not finish within a minute", args))
	}
	return out.String(), errOut.String(), err
}
