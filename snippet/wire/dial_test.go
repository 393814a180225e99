package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// TestDialRefusesAPlantedSymlink: the socket's directory is writable
// inside the sandbox; a snippet that replaces the socket with a symlink to a
// host service's socket must not make flmbox connect there.
func TestDialRefusesAPlantedSymlink(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "host.sock")
	ln, err := net.Listen("unix", host)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The first connection the host socket accepts, by what it reads: the
	// accept queue keeps the order of connections.
	first := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			first <- err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		first <- string(b)
	}()
	planted := filepath.Join(dir, "agent.sock")
	if err := os.Symlink(host, planted); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(context.Background(), planted); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("dial through a symlink: %v", err)
	}
	os.Remove(planted)
	os.WriteFile(planted, []byte("x"), 0o600)
	if _, err := Dial(context.Background(), planted); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("dial a regular file: %v", err)
	}
	// The real socket works, and is the first to connect to it.
	c, err := Dial(context.Background(), host)
	if err != nil {
		t.Fatalf("dial the real socket: %v", err)
	}
	if _, err := c.WriteString("real"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case got := <-first:
		if got != "real" {
			t.Fatalf("the host socket was connected to before the real dial (it read %q)", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the real dial was not accepted")
	}
}
