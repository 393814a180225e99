package sandbox

import (
	"context"
	"testing"
	"time"
)

// TestCloseStopsAndWaits: Close cancels the Manager's background work and
// waits for it; after Close nothing starts in the background; a Close whose
// ctx ends first says so.
func TestCloseStopsAndWaits(t *testing.T) {
	m, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	if !m.background(func(ctx context.Context) {
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // ending takes a moment: Close waits for it
		close(stopped)
	}) {
		t.Fatal("background ran nothing before Close")
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("Close returned before the background work ended")
	}
	if m.background(func(context.Context) { t.Error("ran after Close") }) {
		t.Fatal("background started work after Close")
	}

	m, err = Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	m.background(func(context.Context) { <-release }) // work that ignores its context
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := m.Close(ctx); err == nil {
		t.Fatal("Close says nothing of work that outlived its ctx")
	}
	close(release)
}
