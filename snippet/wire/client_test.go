package wire

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDialStopsWithCtxWhenTheQueueIsFull: a listener that never accepts
// fills its queue; Dial then waits for room until ctx is done, never longer.
func TestDialStopsWithCtxWhenTheQueueIsFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 0); err != nil {
		t.Fatal(err)
	}
	var full error
	for i := 0; i < 16 && full == nil; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		start := time.Now()
		f, err := Dial(ctx, path)
		cancel()
		if err == nil {
			defer f.Close() // stays in the queue
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Dial: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("Dial returned %s after its ctx ended", d)
		}
		full = err
	}
	if full == nil {
		t.Fatal("the listener's queue never filled")
	}
}
