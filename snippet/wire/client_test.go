package wire

import (
	"context"
	"errors"
	"os"
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
	type dialed struct {
		f   *os.File
		err error
	}
	var full error
	for i := 0; i < 16 && full == nil; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		done := make(chan dialed, 1)
		go func() {
			f, err := Dial(ctx, path)
			done <- dialed{f, err}
		}()
		var d dialed
		select {
		case d = <-done:
		case <-time.After(10 * time.Second): // far longer than ctx: it hangs
			t.Fatal("Dial did not return once its ctx ended")
		}
		cancel()
		if d.err == nil {
			defer d.f.Close() // stays in the queue
			continue
		}
		if !errors.Is(d.err, context.DeadlineExceeded) {
			t.Fatalf("Dial: %v", d.err)
		}
		full = d.err
	}
	if full == nil {
		t.Fatal("the listener's queue never filled")
	}
}
