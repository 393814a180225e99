package wire

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
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

// TestNudgeMemory: the client writes a MemoryNudge each time what the host
// charges grew by MemoryNudgeStep since the last nudge or since it was
// least, and nothing for less.
func TestNudgeMemory(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		unix.SetNonblock(fd, true) // for deadlines
	}
	client, agent := os.NewFile(uintptr(fds[0]), "client"), os.NewFile(uintptr(fds[1]), "agent")
	defer client.Close()
	defer agent.Close()
	var charged atomic.Int64
	charged.Store(100 << 20)
	var reads atomic.Int64
	stop := nudgeMemory(client, func() (int64, error) { reads.Add(1); return charged.Load(), nil })
	// polled waits until the client has read the charge twice more: it
	// saw the last change.
	polled := func() {
		t.Helper()
		want := reads.Load() + 2
		for deadline := time.Now().Add(10 * time.Second); reads.Load() < want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the client stopped reading the charge")
			}
		}
	}
	nudges := func(want int) {
		t.Helper()
		if want >= 0 {
			polled()
		}
		want = max(want, 0)
		agent.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		buf := make([]byte, 16)
		n, _ := agent.Read(buf)
		if n != want || strings.Trim(string(buf[:n]), string(rune(MemoryNudge))) != "" {
			t.Fatalf("the client wrote %q, want %d nudges", buf[:n], want)
		}
	}
	nudges(0) // it read where it starts from
	charged.Add(MemoryNudgeStep - 1)
	nudges(0)
	charged.Add(1)
	nudges(1)
	charged.Add(-50 << 20) // freed: growth counts from here
	nudges(0)
	charged.Add(MemoryNudgeStep)
	nudges(1)
	stop() // returns once the client is done: it writes no more
	charged.Add(10 * MemoryNudgeStep)
	nudges(-1)
}
