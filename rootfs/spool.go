package rootfs

import (
	"context"
	"io"
	"os"
	"sync"
)

// spool is a blob being fetched into a file that its reader can read while
// it grows: the unpacker starts on a layer as soon as its first bytes arrive
// instead of waiting for the whole blob. The bytes read before the fetch
// finished are unverified; they only ever reach the staging directory, and
// the layer counts as applied only once the fetch verified the blob.
type spool struct {
	f    *os.File
	mu   sync.Mutex
	cond *sync.Cond
	n    int64 // bytes written so far
	done bool
	err  error // the fetch's error, once done
}

func newSpool(path string) (*spool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	s := &spool{f: f}
	s.cond = sync.NewCond(&s.mu)
	return s, nil
}

// Write appends to the file; only the fetcher writes.
func (s *spool) Write(p []byte) (int, error) {
	n, err := s.f.Write(p)
	s.mu.Lock()
	s.n += int64(n)
	s.mu.Unlock()
	s.cond.Broadcast()
	return n, err
}

// finish records the end of the fetch; the first call wins.
func (s *spool) finish(err error) {
	s.mu.Lock()
	if !s.done {
		s.done, s.err = true, err
	}
	s.mu.Unlock()
	s.cond.Broadcast()
}

// wait returns the fetch's error once the fetch has finished.
func (s *spool) wait() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.done {
		s.cond.Wait()
	}
	return s.err
}

// result reports, without waiting, whether the fetch has finished and with
// what error.
func (s *spool) result() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done, s.err
}

// close closes and removes the file.
func (s *spool) close() {
	s.f.Close()
	os.Remove(s.f.Name())
}

// reader reads the blob from the start, waiting for bytes still to come;
// it ends with the fetch's error, or io.EOF after a successful fetch, or
// ctx's error as soon as ctx is done.
func (s *spool) reader(ctx context.Context) io.Reader {
	context.AfterFunc(ctx, func() {
		s.mu.Lock() // so that no reader is between its check and its Wait
		s.mu.Unlock()
		s.cond.Broadcast()
	})
	return &spoolReader{s: s, ctx: ctx}
}

type spoolReader struct {
	s   *spool
	ctx context.Context
	off int64
}

func (r *spoolReader) Read(p []byte) (int, error) {
	s := r.s
	s.mu.Lock()
	for r.off >= s.n && !s.done && r.ctx.Err() == nil {
		s.cond.Wait()
	}
	n, done, ferr := s.n, s.done, s.err
	s.mu.Unlock()
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	if r.off >= n {
		if done && ferr != nil {
			return 0, ferr
		}
		return 0, io.EOF
	}
	if avail := n - r.off; int64(len(p)) > avail {
		p = p[:avail]
	}
	k, err := s.f.ReadAt(p, r.off)
	r.off += int64(k)
	if err == io.EOF {
		err = nil
	}
	return k, err
}
