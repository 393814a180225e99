package workers

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// TestRun: every index is handed to exactly one worker, no more than limit
// work at once, and a done context stops the handing out.
func TestRun(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]int{}
	var running, most atomic.Int32
	Run(context.Background(), 50, 3, func(next <-chan int) {
		for i := range next {
			if r := running.Add(1); r > most.Load() {
				most.Store(r)
			}
			mu.Lock()
			seen[i]++
			mu.Unlock()
			running.Add(-1)
		}
	})
	if len(seen) != 50 {
		t.Fatalf("%d indexes handed out, want 50", len(seen))
	}
	for i, n := range seen {
		if n != 1 {
			t.Errorf("index %d handed out %d times", i, n)
		}
	}
	if most.Load() > 3 {
		t.Errorf("%d workers at once, want at most 3", most.Load())
	}

	ctx, cancel := context.WithCancel(context.Background())
	var got atomic.Int32
	Run(ctx, 50, 1, func(next <-chan int) {
		for range next {
			if got.Add(1) == 5 {
				cancel()
			}
		}
	})
	if n := got.Load(); n < 5 || n > 6 {
		t.Errorf("%d indexes handed out after the context was done at the 5th, want 5 or 6", n)
	}
	calls := 0
	Run(context.Background(), 0, 4, func(<-chan int) { calls++ })
	if calls != 0 {
		t.Errorf("%d workers for no items, want none", calls)
	}
}
