package pipcache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

func TestInbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an inbox's tmpfs needs root")
	}
	ctx := context.Background()
	c := openCache(t)
	in, err := c.NewInbox(1<<20, 65534, 65534)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var st unix.Stat_t
	if err := unix.Stat(in.Dir, &st); err != nil || st.Uid != 65534 || st.Mode&0o777 != 0o700 {
		t.Fatalf("inbox %+v %v", st, err)
	}
	// Bounded: the writer cannot fill the host's disk.
	if err := os.WriteFile(filepath.Join(in.Dir, "big"), make([]byte, 2<<20), 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing past the inbox's size: %v", err)
	}
	os.Remove(filepath.Join(in.Dir, "big"))

	writeWheel(t, in.Dir, "hello", "1.0", "", helloFiles)
	// A symlink to a host file, under a wheel's name, is refused.
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, wheeltest.Build("secret", "1.0", nil), 0o600)
	link := filepath.Join(in.Dir, "secret-1.0-py3-none-any.whl")
	os.Symlink(secret, link)
	if _, err := c.AddInbox(ctx, in); err == nil || !strings.Contains(err.Error(), "not a wheel file") {
		t.Fatalf("symlink: %v", err)
	}
	os.Remove(link)
	os.WriteFile(filepath.Join(in.Dir, "notes.txt"), nil, 0o644)
	if _, err := c.AddInbox(ctx, in); err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("stray file: %v", err)
	}
	os.Remove(filepath.Join(in.Dir, "notes.txt"))
	if ws, _ := c.List(ctx); len(ws) != 0 {
		t.Fatalf("a refused inbox was half imported: %v", ws)
	}
	ws, err := c.AddInbox(ctx, in)
	if err != nil || len(ws) != 1 || ws[0].Name != "hello" {
		t.Fatalf("AddInbox: %v %v", ws, err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(in.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the inbox is still there: %v", err)
	}
}

// TestInboxLeftByAKilledProcessIsSwept: an inbox whose owner is gone (its
// lock released) is unmounted and removed by the next import.
func TestInboxLeftByAKilledProcessIsSwept(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an inbox's tmpfs needs root")
	}
	c := openCache(t)
	in, err := c.NewInbox(1<<20, 65534, 65534)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(in.Dir, unix.MNT_DETACH) })
	live, err := c.NewInbox(1<<20, 65534, 65534)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	unix.Close(in.fd) // as if its process died
	old := time.Now().Add(-time.Hour)
	os.Chtimes(in.Dir, old, old)
	os.Chtimes(live.Dir, old, old)
	if _, err := c.Add(context.Background(), []string{writeWheel(t, t.TempDir(), "hello", "1.0", "", helloFiles)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(in.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead inbox was kept: %v", err)
	}
	if _, err := os.Stat(live.Dir); err != nil {
		t.Errorf("the live inbox was removed: %v", err)
	}
}
