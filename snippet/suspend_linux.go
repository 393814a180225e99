package snippet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// A checkpoint of the sandbox (runsc checkpoint, for flmbox sandbox
// suspend) cannot save a socket bound on the host, and the agent's listener
// is one (runsc --host-uds=create). So on a Suspend request the agent, if no
// call runs, opens gVisor's /proc/gvisor/checkpoint, closes its listener
// (which removes the socket) and answers; a read of that file returns once
// the checkpoint is over ("restore" in a restored sandbox, "resume" in one
// left running, "error" after a failed checkpoint), and the agent listens
// again (Listen). Calls are locked out from the suspend to the new
// listener: no call can find the sandbox half suspended.

// checkpointFile is gVisor's file whose read waits for the next checkpoint.
const checkpointFile = "/proc/gvisor/checkpoint"

// suspendTimeout bounds the wait for a checkpoint after a suspend: a host
// that asked for one and died meanwhile leaves the agent listening again
// after it, or sooner on wire.AbandonSignal.
const suspendTimeout = time.Minute

// watchAbandon makes wire.AbandonSignal reach a suspended agent's wait (and
// keeps its default action, which would end the agent, from applying).
func (a *Agent) watchAbandon() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.abandon == nil {
		a.abandon = make(chan os.Signal, 1)
		signal.Notify(a.abandon, wire.AbandonSignal)
	}
}

// endingWait bounds how long a suspend waits for the calls' lock while no
// snippet runs: what holds it then is bounded work that a call's end or a
// reset left (the stray sweep, within strayDeadline), or a copy.
const endingWait = strayDeadline + time.Second

// lockCalls takes the calls' lock for a suspend: at once, or, while no
// snippet runs, once the work a call left at its end is done (a suspend
// sent right after a call's answer meets that call's sweep). It is false if
// a snippet runs, or the lock stays held past endingWait.
func (a *Agent) lockCalls() bool {
	deadline := time.Now().Add(endingWait)
	for !a.calls.TryLock() {
		if a.running.Load() > 0 || time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// suspend answers a Suspend request.
func (a *Agent) suspend() *wire.Result {
	res := &wire.Result{Version: wire.ProtocolVersion}
	fail := func(err error) *wire.Result {
		res.ExitCode, res.Error = -1, err.Error()
		return res
	}
	if a.Listen == nil {
		return fail(errors.New("suspend: this agent cannot listen again after a checkpoint"))
	}
	if !a.lockCalls() {
		return fail(errors.New("suspend: calls are running in the sandbox: wait for them to end, or interrupt them"))
	}
	select { // an abandon signal from before this suspend is not for it
	case <-a.abandon:
	default:
	}
	f, err := os.Open(checkpointFile)
	if err != nil {
		a.calls.Unlock()
		return fail(fmt.Errorf("suspend: %w (a gVisor that cannot say when a checkpoint ends)", err))
	}
	a.mu.Lock()
	ln := a.ln
	next := make(chan net.Listener, 1)
	a.suspended = next
	a.mu.Unlock()
	ln.Close() // and its socket: gVisor cannot save a bound host socket
	go a.awaitCheckpoint(f, next)
	res.Suspended = true
	return res
}

// awaitCheckpoint waits for the end of the checkpoint (or suspendTimeout),
// listens again and hands the listener to Serve through next.
func (a *Agent) awaitCheckpoint(f *os.File, next chan net.Listener) {
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 64)
		f.Read(buf) // "restore", "resume" or "error": listen again in every case
		f.Close()
		close(done)
	}()
	a.mu.Lock()
	abandon := a.abandon
	a.mu.Unlock()
	select {
	case <-done:
	case <-abandon:
	case <-time.After(suspendTimeout):
	}
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ln, err = a.Listen(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "flmbox-agent: listen again after a checkpoint: %v\n", err)
		ln = closedListener{}
	}
	a.mu.Lock()
	a.ln, a.suspended = ln, nil
	a.mu.Unlock()
	next <- ln
	a.calls.Unlock()
}

// awaitResume waits, if the agent is suspended, for its next listener; ok
// is false if it is not suspended (or ctx ends).
func (a *Agent) awaitResume(ctx context.Context) (net.Listener, bool) {
	a.mu.Lock()
	next := a.suspended
	a.mu.Unlock()
	if next == nil {
		return nil, false
	}
	select {
	case ln := <-next:
		if _, closed := ln.(closedListener); closed {
			return nil, false
		}
		return ln, true
	case <-ctx.Done():
		return nil, false
	}
}

func (a *Agent) setListener(ln net.Listener) {
	a.mu.Lock()
	a.ln = ln
	a.mu.Unlock()
}

func (a *Agent) listener() net.Listener {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ln
}

// closedListener stands for a listener the agent failed to make again:
// Serve ends.
type closedListener struct{}

func (closedListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (closedListener) Close() error              { return nil }
func (closedListener) Addr() net.Addr            { return nil }
