package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flmbox/flmbox/instance"
)

// startServer serves s on a socket in a temporary directory until the test
// ends; stop stops it and returns serve's error.
func startServer(t *testing.T, s *server) (path string, stop func() error) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "s")
	ln, err := instance.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.serve(ctx, ln) }()
	var once sync.Once
	var serr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case serr = <-done:
			case <-time.After(10 * time.Second):
				serr = errors.New("serve did not return within 10s of its stop")
			}
		})
		return serr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return path, stop
}

func testServer(t *testing.T, timeout time.Duration) *server {
	return newServer(defaultMaxRequest, timeout, t.Logf)
}

// roundTrip sends req on a new connection to path, half-closes it if
// halfClose, and returns all it reads until the server closes.
func roundTrip(t *testing.T, path, req string, halfClose bool) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		if err := c.(*net.UnixConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	answer, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(answer)
}

func TestServe(t *testing.T) {
	s := testServer(t, defaultTimeout)
	path, stop := startServer(t, s)
	tests := []struct {
		name, req string
		halfClose bool
		answer    string
	}{
		{"search", `{"tool": "search", "args": {"query": "Hanoi travel"}}` + "\n", false,
			`{"query":"Hanoi travel","results":[{"title":"Hanoi travel: overview","url":"https://wiki.example/hanoi-travel"},` +
				`{"title":"Hanoi travel: a guide","url":"https://guide.example/hanoi-travel"},` +
				`{"title":"Hanoi travel: latest news","url":"https://news.example/hanoi-travel"}]}` + "\n"},
		{"weather", `{"tool": "weather", "args": {"city": "Hanoi"}}` + "\n", false,
			`{"city":"Hanoi","temp_c":29,"conditions":"sunny"}` + "\n"},
		{"ended by a half-close", `{"tool": "weather", "args": {"city": "Oslo"}}`, true,
			`{"city":"Oslo","temp_c":6,"conditions":"rain"}` + "\n"},
		{"what follows the newline ignored", `{"tool": "weather", "args": {"city": "Oslo"}}` + "\n{\"tool\"", true,
			`{"city":"Oslo","temp_c":6,"conditions":"rain"}` + "\n"},
		{"unknown tool", `{"tool": "terminal", "args": {"command": "ls"}}` + "\n", false,
			`{"error":"unknown tool \"terminal\" (known: search, weather)"}` + "\n"},
		{"bad JSON", "{tool: search}\n", false,
			`{"error":"bad request: invalid character 't' looking for beginning of object key string"}` + "\n"},
		{"empty request", "", true,
			`{"error":"empty request: the stream ended before any byte"}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := roundTrip(t, path, tt.req, tt.halfClose); got != tt.answer {
				t.Errorf("answer\n%q\nwant\n%q", got, tt.answer)
			}
		})
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := s.summary(), "served 4 calls (search 1, weather 3), 3 errors"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

func TestServeOversized(t *testing.T) {
	for _, newline := range []bool{false, true} {
		t.Run(fmt.Sprint("newline ", newline), func(t *testing.T) {
			s := testServer(t, defaultTimeout)
			path, _ := startServer(t, s)
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			// A request of 2 MiB, the JSON of a search: the server stops
			// reading after 1 MiB, so the write fails once it closes.
			req := `{"tool": "search", "args": {"query": "` + strings.Repeat("x", 2<<20) + `"}}`
			if newline {
				req += "\n"
			}
			go io.WriteString(c, req)
			answer, err := io.ReadAll(c)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatal(err)
			}
			if got, want := string(answer), `{"error":"request larger than 1048576 bytes"}`+"\n"; got != want {
				t.Errorf("answer %q, want %q", got, want)
			}
			if got, want := s.summary(), "served 0 calls (search 0, weather 0), 1 error"; got != want {
				t.Errorf("summary %q, want %q", got, want)
			}
		})
	}
}

func TestServeTimeout(t *testing.T) {
	s := testServer(t, 200*time.Millisecond)
	path, _ := startServer(t, s)
	start := time.Now()
	// Half a request, never finished.
	if got, want := roundTrip(t, path, `{"tool": "sea`, false), `{"error":"no request within 200ms"}`+"\n"; got != want {
		t.Errorf("answer %q, want %q", got, want)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("answered after %s, before the timeout", d)
	}
	if got, want := s.summary(), "served 0 calls (search 0, weather 0), 1 error"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

// A stop answers a request being read at once and waits for it.
func TestServeStop(t *testing.T) {
	s := testServer(t, time.Minute)
	path, stop := startServer(t, s)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, `{"tool": `); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not accept the connection within 10s")
		}
	}
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stop took %s", d)
	}
	// The server may close with the request unread (the stop came before
	// its read): the answer, then a reset.
	answer, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	if got, want := string(answer), `{"error":"the server is stopping"}`+"\n"; got != want {
		t.Errorf("answer %q, want %q", got, want)
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Error("the socket still accepts after the stop")
	}
}

func TestServeConcurrent(t *testing.T) {
	s := testServer(t, defaultTimeout)
	path, stop := startServer(t, s)
	const clients = 100
	var wg sync.WaitGroup
	errs := make([]error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var req string
			switch i % 3 {
			case 0:
				req = fmt.Sprintf(`{"tool": "search", "args": {"query": "topic %d"}}`, i)
			case 1:
				req = fmt.Sprintf(`{"tool": "weather", "args": {"city": "city %d"}}`, i)
			default:
				req = fmt.Sprintf(`{"tool": "lookup %d", "args": {}}`, i)
			}
			_, answer, cerr := call([]byte(req))
			want, err := json.Marshal(answer)
			if cerr != nil {
				want, err = json.Marshal(map[string]string{"error": cerr.Error()})
			}
			if err != nil {
				errs[i] = err
				return
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, req+"\n"); err != nil {
				errs[i] = err
				return
			}
			got, err := io.ReadAll(c)
			if err != nil {
				errs[i] = err
				return
			}
			if string(got) != string(want)+"\n" {
				errs[i] = fmt.Errorf("client %d: answer %q, want %q", i, got, want)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := s.summary(), "served 67 calls (search 34, weather 33), 33 errors"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}
