package runcmonitor

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
)

// fakeRunsc writes a runsc that prints its environment's tag variable (if
// any) on stdout and a warning on stderr, then fails if its first
// argument is "fail".
func fakeRunsc(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nprintf '%s' \"${" + tagEnv + "-untagged}\"\necho 'W1 a warning' >&2\n" +
		"for a; do [ \"$a\" = fail ] && { echo 'it failed' >&2; exit 3; }; done\nexit 0\n"
	testprog.Write(t, p, []byte(script))
	return p
}

func TestCallKeepsStderrApartAndTheTagFromRunsc(t *testing.T) {
	rc := &runc.Runc{Command: fakeRunsc(t), Setpgid: true}
	var stdout strings.Builder
	out, err := Call(context.Background(), func(ctx context.Context) error {
		// Create with a caller's stdout: go-runc does not capture it.
		return rc.Create(ctx, "id", "/bundle", &runc.CreateOpts{IO: stdoutIO{&stdout}})
	})
	if err != nil || !out.Started || out.Err != nil {
		t.Fatalf("Call: %+v, %v", out, err)
	}
	if stdout.String() != "untagged" {
		t.Errorf("runsc's environment had %s=%q", tagEnv, stdout.String())
	}
	// Kill: go-runc captures stdout and stderr into one buffer.
	out, err = Call(context.Background(), func(ctx context.Context) error { return rc.Kill(ctx, "fail", 9, nil) })
	var ee *exec.ExitError
	if err == nil || !errors.As(out.Err, &ee) || ee.ExitCode() != 3 || string(out.Stderr) != "W1 a warning\nit failed\n" {
		t.Fatalf("Call of a failing runsc: %v, outcome %v %q", err, out.Err, out.Stderr)
	}
}

func TestCallKillsTheProcessGroup(t *testing.T) {
	dir := t.TempDir()
	p, pids := filepath.Join(dir, "runsc"), filepath.Join(dir, "pids")
	// The child sleep holds runsc's stdout open: only a group kill ends it.
	script := "#!/bin/sh\nsleep 1000 &\necho $! > " + pids + "\nwait\n"
	testprog.Write(t, p, []byte(script))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	out, err := Call(ctx, func(ctx context.Context) error {
		return (&runc.Runc{Command: p, Setpgid: true}).Start(ctx, "id")
	})
	if took := time.Since(start); took > WaitDelay+2*time.Second || err == nil || out.Err == nil {
		t.Fatalf("Call took %s: %v, %v", took, err, out.Err)
	}
	b, _ := os.ReadFile(pids)
	proc := "/proc/" + strings.TrimSpace(string(b))
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := os.ReadFile(proc + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runsc's child %s outlived its killed group", proc)
		}
	}
}

// plainMonitor stands for a monitor another user of go-runc set.
type plainMonitor struct {
	runc.ProcessMonitor
	started int
}

func (m *plainMonitor) Start(cmd *exec.Cmd) (chan runc.Exit, error) {
	m.started++
	return m.ProcessMonitor.Start(cmd)
}

func TestOtherCommandsGoToTheReplacedMonitor(t *testing.T) {
	Call(context.Background(), func(context.Context) error { return nil }) // installs the monitor
	ours := runc.Monitor.(*monitor)
	prev := ours.next
	plain := &plainMonitor{ProcessMonitor: prev}
	ours.next = plain
	defer func() { ours.next = prev }()
	rc := &runc.Runc{Command: fakeRunsc(t)}
	if err := rc.Start(context.Background(), "id"); err != nil || plain.started != 1 {
		t.Fatalf("untagged command: %v, the replaced monitor started %d", err, plain.started)
	}
	if _, err := Call(context.Background(), func(ctx context.Context) error { return rc.Start(ctx, "id") }); err != nil || plain.started != 1 {
		t.Fatalf("tagged command: %v, the replaced monitor started %d", err, plain.started)
	}

	// Replaced in turn, the monitor sees no tagged command: Call says so.
	runc.Monitor = plain
	defer func() { runc.Monitor = ours }()
	_, err := Call(context.Background(), func(ctx context.Context) error { return rc.Start(ctx, "id") })
	if !errors.Is(err, ErrNotMonitored) || !errdefs.IsInternal(err) {
		t.Fatalf("Call without the monitor: %v", err)
	}
}

// stdoutIO is a runc.IO that gives runsc one writer as stdout.
type stdoutIO struct{ w io.Writer }

func (s stdoutIO) Close() error          { return nil }
func (s stdoutIO) Stdin() io.WriteCloser { return nil }
func (s stdoutIO) Stdout() io.ReadCloser { return nil }
func (s stdoutIO) Stderr() io.ReadCloser { return nil }
func (s stdoutIO) Set(cmd *exec.Cmd)     { cmd.Stdout = s.w }

// TestGoRuncAloneLosesWhatRunscSaid shows why the monitor keeps a call's
// wait error and stderr: through go-runc's own monitor, a failed runsc
// command's error is a string (its exit gone from the chain, its whole
// output in the text), and State parses a warning on stderr as JSON.
func TestGoRuncAloneLosesWhatRunscSaid(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\necho 'W1 a warning' >&2\ncase \"$1\" in state) echo '{\"status\":\"running\"}'; exit 0 ;; esac\n" +
		"echo 'loading container: not found' >&2\nexit 1\n"
	testprog.Write(t, p, []byte(script))
	rc := &runc.Runc{Command: p, Setpgid: true}
	err := rc.Kill(context.Background(), "id", 9, nil)
	var ee *exec.ExitError
	var re *runc.ExitError
	if err == nil || errors.As(err, &ee) || errors.As(err, &re) || !strings.Contains(err.Error(), "W1 a warning\n") {
		t.Errorf("go-runc's Kill: %q; it used to lose the exit and quote every line", err)
	}
	if _, err := rc.State(context.Background(), "id"); err == nil {
		t.Error("go-runc's State read a warning and JSON as JSON")
	}
	out, err := Call(context.Background(), func(ctx context.Context) error { return rc.Kill(ctx, "id", 9, nil) })
	if err == nil || !errors.As(out.Err, &ee) || ee.ExitCode() != 1 || !strings.HasSuffix(string(out.Stderr), "not found\n") {
		t.Errorf("Call of Kill: %v, outcome %v %q", err, out.Err, out.Stderr)
	}
	var s *runc.Container
	if _, err := Call(context.Background(), func(ctx context.Context) (err error) { s, err = rc.State(ctx, "id"); return err }); err != nil || s.Status != "running" {
		t.Errorf("Call of State: %+v, %v", s, err)
	}
}

// TestDetachedChildKeepsItsFiles: a runsc run --detach hands its stdio, a
// file, to the sandbox it leaves running; the call must not wait on it.
func TestDetachedChildKeepsItsFiles(t *testing.T) {
	dir := t.TempDir()
	p, pids := filepath.Join(dir, "runsc"), filepath.Join(dir, "pids")
	script := "#!/bin/sh\nsetsid sleep 1000 &\necho $! > " + pids + "\necho started\n"
	testprog.Write(t, p, []byte(script))
	t.Cleanup(func() {
		b, _ := os.ReadFile(pids)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	start := time.Now()
	out, err := Call(context.Background(), func(ctx context.Context) error {
		_, err := (&runc.Runc{Command: p, Setpgid: true, PdeathSignal: syscall.SIGKILL}).Run(ctx, "id", dir, &runc.CreateOpts{IO: FileIO{F: log}, Detach: true})
		return err
	})
	if took := time.Since(start); err != nil || out.Err != nil || took >= WaitDelay {
		t.Fatalf("Call of a detached run: %v, %v after %s", err, out.Err, took)
	}
	if b, _ := os.ReadFile(log.Name()); string(b) != "started\n" {
		t.Errorf("log: %q", b)
	}
}
