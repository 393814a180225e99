package wire

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// answerGrace is how long after a request's timeout Call waits for the
// agent's answer before giving up on a wedged sandbox. The agent answers
// within the timeout plus its drain grace; this is far above that.
const answerGrace = time.Minute

// Dial connects to the agent's socket at path and returns the connection as
// a non-blocking *os.File, whose deadlines work. The socket's directory is
// writable from inside the sandbox, so the final component is never
// followed: a symlink planted there (to a host service's socket) or anything
// but a socket is refused with errdefs.ErrPermissionDenied. The socket is
// opened with O_PATH|O_NOFOLLOW and connected to through /proc/self/fd, so
// what is checked is what is connected to. While the agent's accept queue is
// full, Dial tries again until ctx is done.
//
// Dial uses system calls rather than package net, whose initialisation
// would slow the start of every flmbox run (docs/PERFORMANCE.md,
// "snippet/wire: the client").
func Dial(ctx context.Context, path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dial unix %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("dial unix %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("the agent's socket %s is not a socket (a snippet replaced it?): %w", path, errdefs.ErrPermissionDenied)
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dial unix %s: %w", path, err)
	}
	if err := connect(ctx, s, &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d", fd)}); err != nil {
		unix.Close(s)
		return nil, fmt.Errorf("dial unix %s: %w", path, err)
	}
	return os.NewFile(uintptr(s), path), nil
}

// connect connects the non-blocking Unix socket s to sa. Such a connect
// completes at once or fails with EAGAIN while the listener's accept queue
// is full; then it is tried again, more slowly each time, until ctx is done.
func connect(ctx context.Context, s int, sa unix.Sockaddr) error {
	wait := 100 * time.Microsecond
	for {
		err := unix.Connect(s, sa)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the agent's accept queue stayed full: %w", context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// interruptGrace is how long an interrupted call waits for the agent's
// answer with what the snippet printed: the agent kills the snippet and
// answers within its drain grace (half a second), unless it is of before
// interrupts (Request.Interruptible), when the snippet runs on until the
// connection closes.
const interruptGrace = 5 * time.Second

// Call runs req through the agent listening on the Unix socket socketPath
// and returns its result.
//
// Call validates req first (errors match errdefs.ErrInvalidArgument). It
// returns an error when it gets no result: the agent is not listening (the
// sandbox is dead: errdefs.ErrUnavailable; or its socket was replaced:
// errdefs.ErrPermissionDenied), hung up without answering, did not answer
// within the request's timeout plus a minute, or speaks another protocol
// version (the sandbox was created by another flmbox:
// errdefs.ErrFailedPrecondition). A result is returned as the agent sent it,
// including one that reports an infrastructure error (ExitCode -1 and Error).
//
// Cancelling ctx interrupts the call (see Request.Interruptible, which Call
// sets): the agent kills the snippet and answers with what it printed so
// far, which Call returns (Result.Interrupted) with an error matching
// ErrInterrupted and ctx's cause. Without an answer within a few seconds
// (an agent of before interrupts) Call closes the connection, which kills
// the snippet, and returns no result and that error.
func Call(ctx context.Context, socketPath string, req *Request) (*Result, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	conn, err := Dial(ctx, socketPath)
	if err != nil {
		if errors.Is(err, errdefs.ErrPermissionDenied) {
			return nil, err
		}
		return nil, fmt.Errorf("the sandbox's agent is not answering: %w: %w", err, errdefs.ErrUnavailable)
	}
	defer conn.Close()
	return CallConn(ctx, conn, req)
}

// CallConn is Call on conn, a connection from Dial, for a caller that handles
// a failure to connect itself. req must be valid. It does not close conn.
func CallConn(ctx context.Context, conn *os.File, req *Request) (*Result, error) {
	if req.Callback != nil && req.CallbackDial == nil {
		return nil, fmt.Errorf("a call with a callback needs its CallbackDial: %w", errdefs.ErrInvalidArgument)
	}
	// The deadline also serves ctx: once ctx is done, the answer to the
	// interrupt is awaited for interruptGrace at most.
	conn.SetDeadline(time.Now().Add(time.Duration(req.TimeoutMS)*time.Millisecond + answerGrace))
	interruptible := !req.Ping // a ping is answered at once, or not at all
	stop := context.AfterFunc(ctx, func() {
		if !interruptible || errors.Is(context.Cause(ctx), ErrAbandoned) {
			conn.SetDeadline(time.Unix(1, 0))
			return
		}
		conn.SetDeadline(time.Now().Add(interruptGrace))
		closeWrite(conn) // the interrupt; an agent that read no request yet reads it cut short
	})
	defer stop()

	r := *req
	r.Interruptible = interruptible
	r.MemoryNudges = interruptible && r.Charged != nil
	res, err := exchange(conn, &r)
	if ctx.Err() != nil {
		err := fmt.Errorf("call the sandbox's agent: %w: %w", ErrInterrupted, context.Cause(ctx))
		if res == nil || res.Version != ProtocolVersion {
			return nil, err
		}
		return res, err
	}
	if err != nil {
		return nil, err
	}
	if res.Version != ProtocolVersion {
		return nil, fmt.Errorf("the sandbox's agent speaks protocol %d, this client %d: %w",
			res.Version, ProtocolVersion, ErrProtocolVersion)
	}
	return res, nil
}

// exchange writes req on conn and reads the result. Unless req is
// Interruptible, it half-closes conn after the request.
func exchange(conn *os.File, req *Request) (*Result, error) {
	w := bufio.NewWriterSize(conn, 64<<10)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return nil, agentGone("send the request", err)
	}
	if err := w.Flush(); err != nil {
		return nil, agentGone("send the request", err)
	}
	if !req.Interruptible {
		if err := closeWrite(conn); err != nil {
			return nil, agentGone("send the request", err)
		}
	}
	if req.MemoryNudges {
		stop := nudgeMemory(conn, req.Charged)
		defer stop()
	}

	limit := maxResultSize(req)
	lr := &io.LimitedReader{R: conn, N: limit + 1}
	dec := json.NewDecoder(lr)
	var callbacks sync.WaitGroup
	var refused atomic.Int32 // standby connections the client refused
	cbCtx, endCallbacks := context.WithCancel(context.Background())
	defer callbacks.Wait()
	defer endCallbacks()
	var raw json.RawMessage
	var v struct {
		Version int `json:"version"`
		Event
	}
	for {
		raw = nil
		if err := dec.Decode(&raw); err != nil {
			if lr.N <= 0 {
				return nil, fmt.Errorf("read the agent's answer: over %d bytes", limit)
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, fmt.Errorf("the sandbox's agent did not answer in time (the snippet's timeout plus %s): %w",
					answerGrace, errdefs.ErrUnavailable)
			}
			return nil, agentGone("read the answer", err)
		}
		v.Version, v.Event = 0, Event{}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("read the agent's answer: %w", err)
		}
		if v.Version != 0 || v.Event == (Event{}) {
			break
		}
		if req.CallbackDial == nil {
			return nil, fmt.Errorf("read the agent's answer: a callback event for a call without one")
		}
		ev, path := v.Event, conn.Name()
		callbacks.Go(func() {
			if ev.Ready != "" {
				sb := &standbyOf{path: path, id: ev.Ready, frames: ev.Frames, dial: req.CallbackDial, wg: &callbacks, refused: &refused}
				for range standbys - 1 {
					callbacks.Go(func() { sb.run(cbCtx) })
				}
				sb.run(cbCtx)
				return
			}
			server, err := req.CallbackDial(cbCtx)
			if err != nil {
				Refuse(cbCtx, path, ev.Callback, err)
				return
			}
			Forward(cbCtx, path, ev.Callback, server)
		})
	}
	if v.Version != ProtocolVersion {
		return &Result{Version: v.Version}, nil // its fields may not even parse
	}
	var res Result
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("read the agent's answer: %w", err)
	}
	endCallbacks()
	callbacks.Wait()
	if req.Callback != nil && res.Callbacks == nil && res.Error == "" {
		// An agent of before callbacks ignored the request's field.
		return nil, fmt.Errorf("the sandbox's agent takes no callbacks: %w", ErrProtocolVersion)
	}
	if n := int(refused.Load()); n > 0 && res.Callbacks != nil {
		// The agent counted them forwarded: it gave them to standby
		// connections, which the client then closed.
		res.Callbacks.Connections -= n
		res.Callbacks.Refused += n
	}
	return &res, nil
}

// closeWrite shuts down the sending side of the socket conn: the agent reads
// EOF after the request, which, in an Interruptible call, interrupts it.
func closeWrite(conn *os.File) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	return serr
}

// maxResultSize bounds the JSON of the result of req: both outputs as
// base64 (head and tail), 64 KiB for the rest, and its callback events.
func maxResultSize(req *Request) int64 {
	limit := int(req.OutputLimit())
	data := int64(base64.StdEncoding.EncodedLen(limit/2) + base64.StdEncoding.EncodedLen(limit-limit/2))
	size := 2*data + 64<<10
	if req.Callback != nil {
		conns, _, _ := req.Callback.Limits()
		size += int64(conns) * 256
	}
	return size
}

// Attach connects to the agent's socket at path and makes the connection the
// host's end of the callback connection id (an Event's): what is written to
// it reaches the snippet, what the snippet writes is read from it.
func Attach(ctx context.Context, path, id string) (*os.File, error) {
	return attach(ctx, path, &Request{Version: ProtocolVersion, Attach: id})
}

// Refuse tells the agent at path that the host refuses the callback
// connection id, because of err: the snippet's connection is closed.
func Refuse(ctx context.Context, path, id string, err error) error {
	conn, aerr := attach(ctx, path, &Request{Version: ProtocolVersion, Attach: id, AttachError: err.Error()})
	if aerr != nil {
		return aerr
	}
	return conn.Close()
}

// standbys is how many standby connections the client keeps attached to a
// call's callbacks. With an agent of before framed standby connections, a
// standby taken is replaced once the connection that took it has its first
// answer (or ended), not at once: attaching costs the sandbox a connection
// to accept and a request to read, which would otherwise compete with the
// exchange for its CPU. A framed standby connection is used again once its
// connection ended, and replaced only if cut, or if its connection lasts
// past replaceAfter (so that connections held open do not leave the next
// ones to wait for an attach). The second standby serves a snippet that
// connects again before that.
const standbys = 2

// replaceAfter is how long a framed standby connection carries one
// connection before another standby is attached beside it. The agent keeps
// at most four: it closes the others as they come back.
const replaceAfter = 20 * time.Millisecond

// standbyOf is what the standby connections of a call's callbacks share.
type standbyOf struct {
	path, id string // the agent's socket, the call's callbacks
	frames   bool   // the agent takes framed standby connections
	dial     func(context.Context) (io.ReadWriteCloser, error)
	wg       *sync.WaitGroup // the call's callback goroutines
	refused  *atomic.Int32   // connections the client could not reach its server for
}

// run keeps a connection attached to the callbacks, waiting for the
// snippet's next connection; once one takes it, it dials the server and
// forwards, and has another standby attached (on a goroutine of wg) once
// the server answered or the connection ended (framed: once the connection
// is cut or has lasted replaceAfter), until the agent closes the
// connection (the call ended) or ctx ends. It counts the connections it
// could not reach the server for in refused.
func (s *standbyOf) run(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	agent, err := attach(ctx, s.path, &Request{Version: ProtocolVersion, Attach: s.id, Standby: true, Frames: s.frames})
	if err != nil {
		return
	}
	defer agent.Close()
	stop := context.AfterFunc(ctx, func() { agent.Close() })
	defer stop()
	next := func() { s.wg.Go(func() { s.run(ctx) }) }
	if s.frames {
		s.framed(ctx, agent, next)
		return
	}
	// The wake byte comes with the snippet's first bytes, in one read.
	buf := make([]byte, copyBuffer)
	n, err := agent.Read(buf)
	if n == 0 || err != nil && !errors.Is(err, io.EOF) {
		return
	}
	once := sync.OnceFunc(next)
	defer once()
	server, err := s.dial(ctx)
	if err != nil {
		s.refused.Add(1) // the snippet reads EOF
		return
	}
	forward(ctx, agent, server, buf, copy(buf, buf[1:n]), once)
}

// framed serves the snippet's connections that take the framed standby
// connection agent, one after another, until one is cut or the agent
// closes it.
func (s *standbyOf) framed(ctx context.Context, agent *os.File, next func()) {
	r := bufio.NewReaderSize(agent, copyBuffer)
	for {
		wake, err := r.ReadByte()
		if err != nil || wake != CallbackWake {
			return
		}
		server, err := s.dial(ctx)
		if err != nil {
			s.refused.Add(1) // the agent's connection is closed: the snippet reads EOF
			next()
			return
		}
		// Counted in wg now: wg's Wait may have begun when the timer fires.
		s.wg.Add(1)
		t := time.AfterFunc(replaceAfter, func() {
			defer s.wg.Done()
			s.run(ctx)
		})
		ok := forwardFrames(ctx, agent, r, server)
		replaced := !t.Stop()
		if !replaced {
			s.wg.Done()
		}
		if !ok {
			if !replaced {
				next()
			}
			return
		}
	}
}

// forwardFrames copies one connection's frames from agent (read through r)
// to server and server's bytes to agent as frames, until both directions
// ended (it returns true: agent can carry the next connection) or either
// side failed (false; the caller closes agent). It closes server. A server
// that stops reading has the rest of the snippet's bytes dropped, as a
// closed connection would.
func forwardFrames(ctx context.Context, agent *os.File, r *bufio.Reader, server io.ReadWriteCloser) bool {
	defer server.Close()
	defer closeOnDone(ctx, server, agent)()
	var wg sync.WaitGroup
	var back atomic.Bool // the server's stream ended with CallbackEnd
	wg.Go(func() {
		buf := make([]byte, CallbackHeader+copyBuffer)
		for {
			n, err := server.Read(buf[CallbackHeader:])
			if n > 0 {
				PutCallbackHeader(buf, n)
				if _, werr := agent.Write(buf[:CallbackHeader+n]); werr != nil {
					agent.Close()
					return
				}
			}
			if errors.Is(err, io.EOF) {
				if _, werr := agent.Write([]byte{CallbackEnd}); werr != nil {
					agent.Close()
					return
				}
				back.Store(true)
				return
			}
			if err != nil {
				agent.Close() // the snippet's connection is cut
				return
			}
		}
	})
	stream := NewCallbackStream(r)
	buf := make([]byte, copyBuffer)
	writing := true
	var err error
	for {
		var n int
		n, err = stream.Read(buf)
		if n > 0 && writing {
			if _, werr := server.Write(buf[:n]); werr != nil {
				writing = false
			}
		}
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		if writing {
			switch c := server.(type) {
			case interface{ CloseWrite() error }:
				c.CloseWrite()
			case *os.File:
				closeWrite(c)
			}
		}
	} else {
		server.Close() // the server's direction ends too
		agent.Close()
	}
	wg.Wait()
	return errors.Is(err, io.EOF) && back.Load()
}

// Forward attaches the callback connection id of the agent at path
// (Attach) and copies bytes both ways between it and server, until both
// directions end or ctx does; EOF is passed on as a half close. It closes
// server.
func Forward(ctx context.Context, path, id string, server io.ReadWriteCloser) error {
	defer server.Close()
	agent, err := Attach(ctx, path, id)
	if err != nil {
		return err
	}
	defer agent.Close()
	forward(ctx, agent, server, make([]byte, copyBuffer), 0, nil)
	return nil
}

// closeOnDone closes server and agent once ctx is done, which ends a
// forwarded connection's copies in both directions; the function it returns
// stops that.
func closeOnDone(ctx context.Context, server io.Closer, agent *os.File) func() bool {
	return context.AfterFunc(ctx, func() {
		server.Close()
		agent.Close()
	})
}

// copyBuffer is the size of each direction's buffer of a forwarded
// callback connection.
const copyBuffer = 32 << 10

// forward copies bytes both ways between agent and server until both
// directions end or ctx does: agent's to server on this goroutine with buf,
// whose first read bytes were read already, server's to agent on another.
// answered, if not nil, is called once the server's first bytes are passed
// on, or at its EOF.
func forward(ctx context.Context, agent *os.File, server io.ReadWriteCloser, buf []byte, read int, answered func()) {
	defer server.Close()
	defer closeOnDone(ctx, server, agent)()
	var wg sync.WaitGroup
	wg.Go(func() { pipe(agent, server, make([]byte, copyBuffer), 0, answered) })
	pipe(server, agent, buf, read, nil)
	wg.Wait()
}

// pipe copies src to dst with buf, whose first read bytes are src's
// first, calling first (if not nil) after its first write or at src's end;
// at src's EOF it half-closes dst.
func pipe(dst io.Writer, src io.Reader, buf []byte, read int, first func()) {
	defer func() {
		if first != nil {
			first()
		}
	}()
	for {
		n, err := read, error(nil)
		if read == 0 {
			n, err = src.Read(buf)
		}
		read = 0
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if first != nil {
				first()
				first = nil
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return
		}
	}
	switch c := dst.(type) {
	case interface{ CloseWrite() error }:
		c.CloseWrite()
	case *os.File:
		closeWrite(c)
	}
}

func attach(ctx context.Context, path string, req *Request) (*os.File, error) {
	conn, err := Dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("attach to callback connection %s: %w", req.Attach, err)
	}
	b, _ := json.Marshal(req) // no newline: what follows is the stream
	conn.SetWriteDeadline(time.Now().Add(answerGrace))
	if _, err := conn.Write(b); err != nil {
		conn.Close()
		return nil, fmt.Errorf("attach to callback connection %s: %w", req.Attach, err)
	}
	conn.SetWriteDeadline(time.Time{})
	return conn, nil
}

// ErrProtocolVersion is in the error of a call whose agent speaks another
// version of the protocol: its sandbox was made by another flmbox. It is
// errdefs.ErrFailedPrecondition.
var ErrProtocolVersion = fmt.Errorf("the sandbox was made by another flmbox: %w", errdefs.ErrFailedPrecondition)

// ErrInterrupted is in the error of a call whose context was cancelled
// after its request was sent, with the context's cause (which matches
// context.Canceled or context.DeadlineExceeded). The call returns the
// agent's answer to the interrupt with it, if one came: Result.Interrupted
// if the snippet was killed, or its whole result if it ended first.
var ErrInterrupted = errors.New("the call was interrupted")

// ErrAbandoned, matched by the cause of a call's context, makes CallConn
// give up at once rather than interrupt the call and wait for the agent's
// answer: the connection's I/O fails at once, and the agent kills the
// snippet when the connection is closed. For a caller that knows the agent
// will not answer (it does not answer pings).
var ErrAbandoned = errors.New("the call was abandoned")

// ErrHungUp is in the error of a call whose agent closed the connection
// without answering. The agent answers every request it reads, even a bad
// one, so it died, and a sandbox ends with its agent (its first process).
var ErrHungUp = errors.New("the sandbox's agent hung up without an answer")

// agentGone wraps a failure of the connection after it was made: the agent
// died during the call, usually with its whole sandbox.
func agentGone(doing string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("%s: %w: %w: %w", doing, ErrHungUp, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// nudgeMemory reads charged every MemoryNudgePoll and writes MemoryNudge on
// conn each time it grew by MemoryNudgeStep since the last nudge, or since
// it was least, until stop is called. It stops at the first failure: a
// connection the client shut down (its interrupt) or closed, a cgroup gone
// with its sandbox.
func nudgeMemory(conn *os.File, charged func() (int64, error)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		low, err := charged()
		if err != nil {
			return
		}
		t := time.NewTicker(MemoryNudgePoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			n, err := charged()
			if err != nil {
				return
			}
			switch {
			case n < low:
				low = n
			case n-low >= MemoryNudgeStep:
				if _, err := conn.Write([]byte{MemoryNudge}); err != nil {
					return
				}
				low = n
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
