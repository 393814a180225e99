package instance

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// dials reports whether a server answers on the socket at path.
func dials(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestListenRefusesLiveSocket: a socket a server answers on is left alone,
// refused with a Conflict that says so, and still answers.
func TestListenRefusesLiveSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "instance.sock")
	live, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	ln, err := Listen(path)
	if err == nil {
		ln.Close()
		t.Fatal("Listen took a live server's socket")
	}
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "in use") || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q: want one line, in use, Conflict", err)
	}
	if !dials(path) {
		t.Error("the live server's socket no longer answers")
	}
}

// TestListenReplacesStaleSocket: a socket nobody answers on (its server is
// gone) is replaced.
func TestListenReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "instance.sock")
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false)
	old.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the stale socket: %v", err)
	}
	ln, err := Listen(path)
	if err != nil {
		t.Fatalf("Listen on a stale socket: %v", err)
	}
	defer ln.Close()
	if !dials(path) {
		t.Error("Listen's socket does not answer")
	}
}

// TestListenRefusesPaths: what is not a socket is left as it was, and a
// path too long for a Unix socket is refused saying the limit.
func TestListenRefusesPaths(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(dir, strings.Repeat("s", MaxSocketPath+1-len(dir)-1))
	if len(long) != MaxSocketPath+1 {
		t.Fatalf("long path of %d bytes", len(long))
	}
	for _, tc := range []struct {
		path, want string
		kind       func(error) bool
	}{
		{file, "is not a socket (a regular file)", errdefs.IsAlreadyExists},
		{dir, "is not a socket (a directory)", errdefs.IsAlreadyExists},
		{long, "108 bytes, more than a Unix socket's 107", errdefs.IsInvalidArgument},
		{"", "no socket path", errdefs.IsInvalidArgument},
	} {
		ln, err := Listen(tc.path)
		if err == nil {
			ln.Close()
			t.Errorf("Listen(%q) succeeded", tc.path)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !tc.kind(err) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Listen(%q): %v; want one line with %q, and its kind", tc.path, err, tc.want)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Errorf("the regular file: %q, %v", b, err)
	}
	// The longest path that fits is taken.
	fits := long[:len(long)-1]
	ln, err := Listen(fits)
	if err != nil {
		t.Fatalf("Listen on a path of %d bytes: %v", len(fits), err)
	}
	ln.Close()
}

// TestListenCloseKeepsAnotherSocket: a Listener removes its socket when it
// closes, but not a socket made at its path since (another process's).
func TestListenCloseKeepsAnotherSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "instance.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("a closed Listener's socket: %v", err)
	}

	ln, err = Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	// Someone removes it and serves there.
	os.Remove(path)
	other, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ln.Close()
	ln.Close() // again: nothing more
	if !dials(path) {
		t.Error("closing the first Listener removed the other's socket")
	}
}

// TestServeTwoOnOnePath: a second Serve on the path of a first is refused
// at Listen; the first keeps serving and its socket survives the second's
// end, and goes with the first's.
func TestServeTwoOnOnePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "instance.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, newServer(&fakeSandboxes{}, Options{}), ln) }()

	if ln2, err := Listen(path); err == nil {
		ctx2, cancel2 := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx2, newServer(&fakeSandboxes{}, Options{}), ln2) }()
		cancel2()
		<-done
		t.Error("a second Listen on a served socket succeeded")
	}
	if !dials(path) {
		t.Fatal("the first server's socket no longer answers")
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the first server's socket after it ended: %v", err)
	}
}
