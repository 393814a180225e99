package wire

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

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
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
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
	select {
	case <-accepted:
		t.Fatal("the host socket was connected to")
	default:
	}
	// The real socket works.
	c, err := Dial(context.Background(), host)
	if err != nil {
		t.Fatalf("dial the real socket: %v", err)
	}
	c.Close()
}
