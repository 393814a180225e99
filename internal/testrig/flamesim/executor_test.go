package flamesim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary an application (helper) instead of the
// tests.
const helperEnv = "FLAMESIM_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

// helper is an application that is no gRPC server: it listens on
// FLAME_INSTANCE_ENDPOINT (unless mode is "exit" or "mute"), says where it
// runs on stderr, and waits for SIGTERM (which mode "stubborn" ignores).
func helper(mode string) int {
	wd, _ := os.Getwd()
	pgid, _ := syscall.Getpgid(0)
	fmt.Fprintf(os.Stderr, "wd=%s pgid-is-pid=%t extra=%s\n", wd, pgid == os.Getpid(), os.Getenv("FLAMESIM_EXTRA"))
	switch mode {
	case "exit":
		fmt.Fprintln(os.Stderr, "no luck")
		return 3
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
	}
	term := make(chan os.Signal, 1)
	if mode != "stubborn" {
		signal.Notify(term, syscall.SIGTERM)
	}
	if mode != "mute" {
		ln, err := net.Listen("unix", os.Getenv(EndpointEnv))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer ln.Close()
	}
	select {
	case <-term:
	case <-time.After(time.Hour): // the test kills it
	}
	return 0
}

// startHelper starts the test binary as an application in mode.
func startHelper(t *testing.T, ctx context.Context, mode string, stderr *bytes.Buffer) (*Executor, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Start(ctx, exe, []string{"-test.run=^$"}, Options{Dir: t.TempDir(), Stderr: stderr,
		Env: []string{helperEnv + "=" + mode, "FLAMESIM_EXTRA=x"}})
}

func TestStartStop(t *testing.T) {
	var stderr bytes.Buffer
	e, err := startHelper(t, context.Background(), "listen", &stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Kill)
	if filepath.Base(e.Socket()) != SocketName {
		t.Errorf("socket %s", e.Socket())
	}
	if err := e.Stop(time.Minute); err != nil {
		t.Fatalf("Stop: %v\n%s", err, stderr.String())
	}
	// stderr is complete once Stop has returned.
	want := fmt.Sprintf("wd=%s pgid-is-pid=true extra=x\n", filepath.Dir(e.Socket()))
	if stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
	if err := e.Stop(time.Minute); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
	e.Kill() // does nothing more
}

func TestStopKillsAfterGrace(t *testing.T) {
	e, err := startHelper(t, context.Background(), "stubborn", &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Kill)
	// It ignores SIGTERM (set before it listened), so it is killed.
	if err := e.Stop(10 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Stop: %v, want killed", err)
	}
}

func TestStartFails(t *testing.T) {
	var stderr bytes.Buffer
	_, err := startHelper(t, context.Background(), "exit", &stderr)
	if err == nil || !strings.Contains(err.Error(), "exited before its socket") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("an application that exits: %v", err)
	}
	if !strings.Contains(stderr.String(), "no luck") {
		t.Errorf("stderr %q", stderr.String())
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("given up")
	cancel(cause)
	stderr.Reset()
	if _, err := startHelper(t, ctx, "mute", &stderr); !errors.Is(err, cause) {
		t.Errorf("an application that makes no socket: %v, want %v", err, cause)
	}

	if _, err := Start(context.Background(), "/bin/true", nil, Options{}); err == nil {
		t.Error("Start without a directory")
	}
}

func TestWaitSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SocketName)
	running := make(chan struct{})
	// A plain file is not a socket: still waiting when ctx ends.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitSocket(ctx, path, running); !errors.Is(err, context.Canceled) {
		t.Errorf("a plain file: %v", err)
	}
	os.Remove(path)

	// A listener made while it waits.
	done := make(chan error, 1)
	go func() { done <- waitSocket(context.Background(), path, running) }()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := <-done; err != nil {
		t.Errorf("a listener: %v", err)
	}

	// The process exits first.
	exited := make(chan struct{})
	close(exited)
	if err := waitSocket(context.Background(), filepath.Join(dir, "none.sock"), exited); !errors.Is(err, errExited) {
		t.Errorf("exited: %v", err)
	}
}
