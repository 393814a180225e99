// Package workers hands out the items of a batch to a bounded number of
// goroutines.
package workers

import (
	"context"
	"runtime"
	"sync"
)

// Run starts min(n, limit) workers (limit <= 0: one per CPU), each
// work(next), where next yields the indexes 0..n-1, each to one worker, in
// order, until all are handed out or ctx is done; it returns once every
// worker has. Items not handed out when ctx ends are left to the caller.
func Run(ctx context.Context, n, limit int, work func(next <-chan int)) {
	if limit <= 0 {
		limit = runtime.NumCPU()
	}
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range n {
			if ctx.Err() != nil {
				return // select would choose at random between a ready worker and ctx
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range min(limit, n) {
		wg.Go(func() { work(next) })
	}
	wg.Wait()
}
