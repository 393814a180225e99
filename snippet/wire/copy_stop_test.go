package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// copyInWithin runs CopyConn for a CopyIn of r against a fake agent (which,
// as the real one, reads frames until the stream ends or the connection
// fails), and fails the test unless it returns within d.
func copyInWithin(t *testing.T, ctx context.Context, d time.Duration, r io.Reader) error {
	t.Helper()
	client, agent := socketPair(t)
	var in bytes.Buffer
	fakeAgent(agent, &in, nil, nil)
	done := make(chan error, 1)
	go func() {
		_, err := CopyConn(ctx, client, &Copy{Op: CopyIn, Path: "/tmp/d"}, r, nil)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("CopyConn did not return within %s", d)
		return nil
	}
}

// TestCopyConnReaderFails: a CopyIn whose stream fails part way (flmbox
// cp's host-side Archive past --max-size, or a file it cannot read) ends
// with the reader's error, at once: the agent must learn that the stream
// ended, and not wait for more frames (CopyTimeout, 30 minutes).
func TestCopyConnReaderFails(t *testing.T) {
	boom := errors.New("boom")
	err := copyInWithin(t, t.Context(), 10*time.Second, io.MultiReader(bytes.NewReader(make([]byte, 1000)), &errReader{boom}))
	if err == nil {
		t.Fatal("CopyConn: no error for a stream that failed")
	}
	if !errors.Is(err, boom) {
		t.Errorf("CopyConn: %v, want the reader's error", err)
	}
}

// TestCopyConnStopsWithCtx: a CopyIn ends when its ctx is done, even while
// its reader is blocked (flmbox cp - with a stdin that sends nothing).
func TestCopyConnStopsWithCtx(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	pr, pw := io.Pipe() // a stream that never ends
	defer pw.Close()
	go func() {
		pw.Write([]byte("some"))
		cancel(errors.New("interrupted"))
	}()
	err := copyInWithin(t, ctx, 10*time.Second, pr)
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("CopyConn: %v, want ctx's cause", err)
	}
}
