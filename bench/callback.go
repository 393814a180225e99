package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

const (
	// callbackSize is the size of a callback exchange's request and of
	// its answer.
	callbackSize = 1024
	// callbackWarmup is the number of round trips each run makes before
	// its measured ones, checked but not measured.
	callbackWarmup = 5
	// maxCallbackTrips bounds Options.CallbackTrips: a call forwards at
	// most wire.MaxCallbackConns connections.
	maxCallbackTrips = 1000
)

// callbackCode is the Python client both sides run: warmup and then trips
// round trips to the Unix socket in $FLMBOX_CALLBACK_SOCKET (connect, send
// a request of callbackSize bytes, read an answer of as many or until the
// server closes, close), each timed with perf_counter_ns. It prints a line
// "NS BYTES" per round trip, the warm-up ones first (parseTrips reads them).
func callbackCode(warmup, trips int) string {
	return fmt.Sprintf(`import os, socket, time
path = os.environ[%q]
request = b"q" * %[2]d
def trip():
    start = time.perf_counter_ns()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(request)
    got = 0
    while got < %[2]d:
        chunk = s.recv(%[2]d - got)
        if not chunk:
            break
        got += len(chunk)
    s.close()
    return time.perf_counter_ns() - start, got
out = [trip() for _ in range(%[3]d)]
print("\n".join("%%d %%d" %% t for t in out))
`, sandbox.CallbackSocketEnv, callbackSize, warmup+trips)
}

// parseTrips reads callbackCode's output: warmup+trips lines, each answer
// callbackSize bytes. It returns the measured round trips' times in
// milliseconds, without the warm-up ones.
func parseTrips(out string, warmup, trips int) ([]float64, error) {
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != warmup+trips {
		return nil, fmt.Errorf("read the round trips' times: %d lines, want %d: %q", len(lines), warmup+trips, lastLines(out, 3))
	}
	xs := make([]float64, 0, trips)
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != 2 {
			return nil, fmt.Errorf("read the round trips' times: line %d: %q", i+1, l)
		}
		ns, err1 := strconv.ParseInt(f[0], 10, 64)
		n, err2 := strconv.Atoi(f[1])
		if err := errors.Join(err1, err2); err != nil || ns <= 0 {
			return nil, fmt.Errorf("read the round trips' times: line %d: %q", i+1, l)
		}
		if n != callbackSize {
			return nil, fmt.Errorf("check round trip %d: an answer of %d bytes, want %d", i+1, n, callbackSize)
		}
		if i >= warmup {
			xs = append(xs, float64(ns)/1e6)
		}
	}
	return xs, nil
}

// callbackServer is the host's end of the callback round trips, in the
// bench's process: on a Unix socket, it reads a request of callbackSize
// bytes (or until the client's half close) on each connection, answers
// callbackSize bytes and closes. A request of another size is a failure.
type callbackServer struct {
	path string
	ln   net.Listener
	wg   sync.WaitGroup

	mu       sync.Mutex
	requests int   // whole requests since the last take
	err      error // the first failure since the last take
}

// startCallbackServer listens at path and serves until close.
func startCallbackServer(path string) (*callbackServer, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen for callbacks: %w", err)
	}
	s := &callbackServer{path: path, ln: ln}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *callbackServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.failed(fmt.Errorf("accept a callback connection: %w", err))
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.answer(c); err != nil {
				s.failed(err)
			}
		}()
	}
}

// answer serves one exchange on c and closes it. A whole request is
// counted before it is answered, so that a client that has its answers
// has been counted.
func (s *callbackServer) answer(c net.Conn) error {
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		return err
	}
	buf := make([]byte, callbackSize)
	n, err := io.ReadFull(c, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read a callback request: %w", err)
	}
	if n != callbackSize {
		return fmt.Errorf("check a callback request: %d bytes, want %d", n, callbackSize)
	}
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	for i := range buf {
		buf[i] = 'a'
	}
	if _, err := c.Write(buf); err != nil {
		return fmt.Errorf("answer a callback request: %w", err)
	}
	return nil
}

// failed keeps the first failure since the last take.
func (s *callbackServer) failed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// take returns the whole requests since the last take, and the first
// failure.
func (s *callbackServer) take() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.requests, s.err
	s.requests, s.err = 0, nil
	return n, err
}

// close stops listening, waits for the exchanges being served and returns
// the first failure not taken yet.
func (s *callbackServer) close() error {
	err := s.ln.Close()
	s.wg.Wait()
	_, ferr := s.take()
	return errors.Join(err, ferr)
}

// callbackSide is one side of the callback figure, and its runs' times.
type callbackSide struct {
	name   string
	run    func(ctx context.Context) ([]float64, error)
	rounds [][]float64
}

// measureCallback measures callback round trips from inside sb, a sandbox
// of the bench's spec: Rounds calls through Manager.Call with a Callback
// whose Dial connects to a server in this process, each making
// CallbackTrips measured round trips after callbackWarmup others, against
// as many host python3 processes running the same code on the same server's
// socket directly, in alternating order (inside, host, host, inside, …).
// Every answer, the call's Result.Callbacks and the server's count of
// exchanges are checked.
func (r *runner) measureCallback(ctx context.Context, sb *sandbox.Sandbox) (_ Callback, err error) {
	srv, err := startCallbackServer(filepath.Join(r.dir, "callback.sock"))
	if err != nil {
		return Callback{}, err
	}
	defer func() { err = errors.Join(err, srv.close()) }()
	dial, err := sandbox.DialUnix(srv.path)
	if err != nil {
		return Callback{}, err
	}
	trips, total := r.opts.CallbackTrips, callbackWarmup+r.opts.CallbackTrips
	code := callbackCode(callbackWarmup, trips)
	sides := []*callbackSide{
		{name: "inside, Manager.Call", run: func(ctx context.Context) ([]float64, error) {
			req := sandbox.Request{Code: code, Timeout: 2 * time.Minute, MaxOutput: sandbox.DefaultMaxOutput,
				Callback: &sandbox.Callback{Dial: dial, MaxConns: total}}
			res, err := sb.Call(ctx, req)
			if err != nil {
				return nil, err
			}
			if stderr := string(res.Stderr.Data); res.ExitCode != 0 || stderr != "" {
				return nil, fmt.Errorf("check the result: exit %d, stderr %q", res.ExitCode, lastLines(stderr, 5))
			}
			if err := checkCallbacks(res.Callbacks, total); err != nil {
				return nil, err
			}
			return parseTrips(string(res.Stdout.Data), callbackWarmup, trips)
		}},
		{name: "host python3", run: func(ctx context.Context) ([]float64, error) {
			cmd := exec.CommandContext(ctx, r.python, "-c", code)
			cmd.Env = append(os.Environ(), sandbox.CallbackSocketEnv+"="+srv.path)
			_, out, err := timeCommand(cmd)
			if err != nil {
				return nil, err
			}
			return parseTrips(string(out), callbackWarmup, trips)
		}},
	}
	for round := range r.opts.Rounds {
		r.logf("callbacks: round %d of %d", round+1, r.opts.Rounds)
		for j := range sides {
			side := sides[(round+j)%len(sides)]
			xs, err := side.run(ctx)
			if err == nil {
				var n int
				if n, err = srv.take(); err == nil && n != total {
					err = fmt.Errorf("the server had %d requests, want %d", n, total)
				}
			}
			if err != nil {
				return Callback{}, fmt.Errorf("callback round trips (%s): %w", side.name, err)
			}
			side.rounds = append(side.rounds, xs)
		}
	}
	cb := Callback{InsideMS: summarizeRounds(sides[0].rounds), HostMS: summarizeRounds(sides[1].rounds),
		RoundTrips: r.opts.Rounds * trips, Runs: r.opts.Rounds}
	cb.AddedMS = cb.InsideMS.Median - cb.HostMS.Median
	return cb, nil
}

// checkCallbacks fails unless a call forwarded exactly total connections,
// refused none and carried a request and an answer of callbackSize bytes
// on each.
func checkCallbacks(cb *sandbox.CallbackStats, total int) error {
	switch want := int64(total) * callbackSize; {
	case cb == nil:
		return errors.New("check the result: no callback counts")
	case cb.Connections != total || cb.Refused != 0:
		return fmt.Errorf("check the result: %d callback connections, %d refused; want %d, none refused", cb.Connections, cb.Refused, total)
	case cb.BytesOut != want || cb.BytesIn != want:
		return fmt.Errorf("check the result: %d bytes to the host, %d back; want %d each way", cb.BytesOut, cb.BytesIn, want)
	}
	return nil
}
