package testimage

import (
	"context"
	"errors"

	"github.com/flmbox/flmbox/internal/flock"
)

// lockPoll is how often, at most, a waiting lock retries.
const lockPoll = flock.MaxPoll

// lockFile takes an exclusive flock(2) on path, creating the file, and
// returns the function that releases it. It waits for other holders until
// ctx is done; waiting is called once if it must wait. The lock dies with
// the process, so a crashed build never blocks the next one.
func lockFile(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	l, err := flock.TryLockFile(path, 0o644, flock.Exclusive)
	if errors.Is(err, flock.ErrLocked) {
		waiting()
		l, err = flock.LockFile(ctx, path, 0o644, flock.Exclusive)
	}
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}
