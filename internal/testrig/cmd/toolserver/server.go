package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// errEmpty is a connection's stream ending before any byte of a request.
var errEmpty = errors.New("empty request: the stream ended before any byte")

// server answers tool calls, one per connection, and counts them.
type server struct {
	maxRequest int64
	timeout    time.Duration
	logf       func(format string, args ...any)

	mu       sync.Mutex
	calls    map[string]int // calls answered with a result, by tool
	errors   int            // requests answered with an error
	conns    map[net.Conn]struct{}
	stopping bool
}

func newServer(maxRequest int64, timeout time.Duration, logf func(string, ...any)) *server {
	return &server{
		maxRequest: maxRequest,
		timeout:    timeout,
		logf:       logf,
		calls:      map[string]int{},
		conns:      map[net.Conn]struct{}{},
	}
}

// serve accepts connections on ln and answers each in its own goroutine
// until ctx is done; then it closes ln, cuts short the requests still being
// read (they are answered with an error) and returns once every connection
// is closed.
func (s *server) serve(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.stopping = true
		for c := range s.conns {
			c.SetReadDeadline(time.Now())
		}
	})
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			ln.Close()
			return fmt.Errorf("accept: %w", err)
		}
		if !s.track(c) {
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.untrack(c)
			s.handle(c)
		}()
	}
}

// track sets c's deadline and adds it to the connections that a stop cuts
// short; it is false once the server is stopping.
func (s *server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	c.SetDeadline(time.Now().Add(s.timeout))
	s.conns[c] = struct{}{}
	return true
}

func (s *server) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// handle reads c's request, answers it and closes c.
func (s *server) handle(c net.Conn) {
	defer c.Close()
	data, err := readRequest(c, s.maxRequest)
	var name string
	var answer any
	if err == nil {
		name, answer, err = call(data)
	}
	s.mu.Lock()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The deadline passed for the write too: a moment more to say why.
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if s.stopping {
				err = errors.New("the server is stopping")
			} else {
				err = fmt.Errorf("no request within %s", s.timeout)
			}
		}
		s.errors++
		answer = struct {
			Error string `json:"error"`
		}{err.Error()}
	} else {
		s.calls[name]++
	}
	s.mu.Unlock()
	if err != nil {
		s.logf("%v", err)
	}
	line, merr := json.Marshal(answer)
	if merr != nil {
		panic(fmt.Sprintf("marshal an answer: %v", merr)) // answers are plain structs
	}
	if _, err := c.Write(append(line, '\n')); err != nil {
		s.logf("answer (%d bytes): %v", len(line)+1, err) // the client is gone
	}
}

// readRequest reads a request from r: its bytes up to a newline (not
// included) or to the end of the stream, at most limit bytes.
func readRequest(r io.Reader, limit int64) ([]byte, error) {
	var buf []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		got := chunk[:n]
		nl := bytes.IndexByte(got, '\n')
		if nl >= 0 {
			got = got[:nl]
		}
		buf = append(buf, got...)
		switch {
		case int64(len(buf)) > limit:
			return nil, fmt.Errorf("request larger than %d bytes", limit)
		case nl >= 0:
			return buf, nil
		case errors.Is(err, io.EOF) && len(buf) == 0:
			return nil, errEmpty
		case errors.Is(err, io.EOF):
			return buf, nil
		case err != nil:
			return nil, fmt.Errorf("read request: %w", err)
		}
	}
}

// summary says what the server served:
// "served N calls (search K, weather W), E errors".
func (s *server) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	var each []string
	for _, name := range toolNames() {
		n += s.calls[name]
		each = append(each, fmt.Sprintf("%s %d", name, s.calls[name]))
	}
	return fmt.Sprintf("served %s (%s), %s", plural(n, "call"), strings.Join(each, ", "), plural(s.errors, "error"))
}

// plural is "1 call", "2 calls", "0 calls".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
