package bench

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/sandbox"
)

func TestParseTrips(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      []float64
		err       string // "": valid
	}{
		{name: "two after one warm-up", out: "900000 1024\n1500000 1024\n250000 1024\n", want: []float64{1.5, 0.25}},
		{name: "no final newline", out: "1 1024\n2000000 1024\n1000000 1024", want: []float64{2, 1}},
		{name: "a short answer", out: "1 1024\n2 1024\n3 512\n", err: "check round trip 3: an answer of 512 bytes"},
		{name: "a short warm-up answer", out: "1 0\n2 1024\n3 1024\n", err: "check round trip 1: an answer of 0 bytes"},
		{name: "too few", out: "1 1024\n2 1024\n", err: "2 lines, want 3"},
		{name: "nothing", out: "", err: "1 lines, want 3"},
		{name: "not numbers", out: "1 1024\nx 1024\n3 1024\n", err: `line 2: "x 1024"`},
		{name: "one field", out: "1 1024\n2\n3 1024\n", err: `line 2: "2"`},
		{name: "a zero time", out: "1 1024\n0 1024\n3 1024\n", err: `line 2: "0 1024"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTrips(tc.out, 1, 2)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) || got[0] != tc.want[0] || got[1] != tc.want[1] {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCheckCallbacks(t *testing.T) {
	for _, tc := range []struct {
		name string
		cb   *sandbox.CallbackStats
		err  string // "": valid
	}{
		{"all", &sandbox.CallbackStats{Connections: 3, BytesIn: 3072, BytesOut: 3072}, ""},
		{"no counts", nil, "no callback counts"},
		{"one missing", &sandbox.CallbackStats{Connections: 2, BytesIn: 2048, BytesOut: 2048}, "2 callback connections"},
		{"one refused", &sandbox.CallbackStats{Connections: 3, Refused: 1, BytesIn: 3072, BytesOut: 3072}, "1 refused"},
		{"an answer cut", &sandbox.CallbackStats{Connections: 3, BytesIn: 3000, BytesOut: 3072}, "3072 bytes to the host, 3000 back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCallbacks(tc.cb, 3)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want one with %q", err, tc.err)
			}
		})
	}
}

// TestCallbackHost runs the callback figure's Python client on the host
// against the server, as its baseline does, and checks what the server
// counts: every exchange, and a request of the wrong size as a failure.
func TestCallbackHost(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	srv, err := startCallbackServer(filepath.Join(t.TempDir(), "cb.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.close() }) // a second close fails, unchecked

	cmd := exec.CommandContext(t.Context(), python, "-c", callbackCode(2, 5))
	cmd.Env = append(os.Environ(), sandbox.CallbackSocketEnv+"="+srv.path)
	_, out, err := timeCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	xs, err := parseTrips(string(out), 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range xs {
		if x <= 0 || x > 10000 {
			t.Errorf("a round trip of %v ms", x)
		}
	}
	if n, err := srv.take(); n != 7 || err != nil {
		t.Fatalf("the server had %d requests (%v), want 7", n, err)
	}

	// A client that half-closes after 10 bytes gets no answer, and the
	// server reports it.
	c, err := net.Dial("unix", srv.path)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(make([]byte, 10))
	c.(*net.UnixConn).CloseWrite()
	if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
		t.Errorf("a short request was answered with %d bytes (%v)", len(b), err)
	}
	c.Close()
	if err := srv.close(); err == nil || !strings.Contains(err.Error(), "10 bytes, want 1024") {
		t.Fatalf("after a short request: %v", err)
	}
}
