package wire

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// frames checks that stream is well framed (data frames of 1 to maxFrame
// bytes, then 'E', then nothing) and returns the data frames' sizes.
func frames(t *testing.T, stream []byte) []int {
	t.Helper()
	var sizes []int
	for len(stream) > 0 {
		switch stream[0] {
		case 'E':
			if len(stream) != 1 {
				t.Fatalf("%d bytes after the end of the stream", len(stream)-1)
			}
			return sizes
		case 'D':
			if len(stream) < 5 {
				t.Fatalf("a frame header cut short: %q", stream)
			}
			n := int(binary.BigEndian.Uint32(stream[1:5]))
			if n == 0 || n > maxFrame || len(stream) < 5+n {
				t.Fatalf("a frame of %d bytes (%d left)", n, len(stream)-5)
			}
			sizes = append(sizes, n)
			stream = stream[5+n:]
		default:
			t.Fatalf("a frame starts with %q", stream[0])
		}
	}
	t.Fatal("no end of the stream")
	return nil
}

// TestFramesRoundTrip: what writeFrames sends, readFrames gives back, in
// frames of at most maxFrame bytes, the end marked.
func TestFramesRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		size   int
		frames int
	}{
		{"empty", 0, 0},
		{"one byte", 1, 1},
		{"one frame less a byte", maxFrame - 1, 1},
		{"one frame", maxFrame, 1},
		{"one frame and a byte", maxFrame + 1, 2},
		{"several frames", 3*maxFrame + 7, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := make([]byte, tc.size)
			rand.Read(data)
			var wire bytes.Buffer
			// A reader that gives 4 KiB at a time still makes full frames.
			if err := writeFrames(&wire, &chunkReader{r: bytes.NewReader(data), n: 4096}); err != nil {
				t.Fatal(err)
			}
			if sizes := frames(t, wire.Bytes()); len(sizes) != tc.frames {
				t.Errorf("%d frames of sizes %v, want %d", len(sizes), sizes, tc.frames)
			}
			// A request's line ends with '\n' before the first frame.
			r := bufio.NewReader(io.MultiReader(strings.NewReader("\n"), &wire, strings.NewReader(`{"version":1}`)))
			var got bytes.Buffer
			if err := readFrames(r, &got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), data) {
				t.Errorf("read %d bytes back, not the %d sent", got.Len(), len(data))
			}
			// readFrames stops at the end: what follows (the Result) is left.
			if rest, _ := io.ReadAll(r); string(rest) != `{"version":1}` {
				t.Errorf("after the stream: %q, want the Result", rest)
			}
		})
	}
}

// chunkReader reads at most n bytes at a time from r.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// TestReadFramesRefuses: a stream that is not well framed fails, never
// passes for a shorter one.
func TestReadFramesRefuses(t *testing.T) {
	frame := func(n uint32, body string) string {
		var h [5]byte
		h[0] = 'D'
		binary.BigEndian.PutUint32(h[1:], n)
		return string(h[:]) + body
	}
	for _, tc := range []struct {
		name, stream, want string
		hungUp             bool
	}{
		{"bad tag", "X", "a frame starts with 'X'", false},
		{"a result after a frame", frame(2, "ab") + "{", "a result in place of the stream", false},
		{"oversize frame", frame(maxFrame+1, ""), "a frame of 1048577 bytes, over 1048576", false},
		{"huge frame", frame(1<<32-1, ""), "over 1048576", false},
		{"length cut short", "D\x00\x00", "read the archive", true},
		{"body cut short", frame(10, "abc"), "read the archive", false},
		{"no end", frame(3, "abc"), "read the archive", true},
		{"nothing", "", "read the archive", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := readFrames(bufio.NewReader(strings.NewReader(tc.stream)), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("readFrames: %v, want an error saying %q", err, tc.want)
			}
			if tc.hungUp && !errors.Is(err, ErrHungUp) {
				t.Errorf("readFrames: %v, want ErrHungUp", err)
			}
		})
	}
}

// TestWriteFramesReaderFails: a stream whose reader fails is not ended:
// the other side must not take a partial archive for a whole one.
func TestWriteFramesReaderFails(t *testing.T) {
	boom := errors.New("boom")
	var wire bytes.Buffer
	r := io.MultiReader(bytes.NewReader(make([]byte, 100)), &errReader{boom})
	if err := writeFrames(&wire, r); !errors.Is(err, boom) {
		t.Fatalf("writeFrames: %v, want the reader's error", err)
	}
	if bytes.HasSuffix(wire.Bytes(), []byte("E")) {
		t.Error("a failed stream was ended as a whole one")
	}
}

type errReader struct{ err error }

func (r *errReader) Read([]byte) (int, error) { return 0, r.err }

// TestCopyValidate: a Copy must name an operation, an absolute, clean
// path, and a bound in range.
func TestCopyValidate(t *testing.T) {
	for _, tc := range []struct {
		c    Copy
		want string // "" for valid
	}{
		{Copy{Op: CopyIn, Path: "/tmp/x"}, ""},
		{Copy{Op: CopyOut, Path: "/", MaxBytes: MaxCopyBytes}, ""},
		{Copy{Op: "sideways", Path: "/tmp"}, `copy "sideways"`},
		{Copy{Op: CopyIn, Path: "tmp/x"}, "want an absolute, clean path"},
		{Copy{Op: CopyIn, Path: "/tmp/../etc"}, "want an absolute, clean path"},
		{Copy{Op: CopyIn, Path: "/tmp/x/"}, "want an absolute, clean path"},
		{Copy{Op: CopyIn, Path: "/tmp/x\x00y"}, "want an absolute, clean path"},
		{Copy{Op: CopyIn, Path: ""}, "want an absolute, clean path"},
		{Copy{Op: CopyIn, Path: "/tmp", MaxBytes: -1}, "copy max bytes -1"},
		{Copy{Op: CopyIn, Path: "/tmp", MaxBytes: MaxCopyBytes + 1}, "copy max bytes"},
	} {
		err := (&Request{Version: ProtocolVersion, Copy: &tc.c}).Validate()
		if tc.want == "" && err != nil || tc.want != "" && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
	if got := (&Copy{}).Limit(); got != DefaultCopyBytes {
		t.Errorf("Limit of 0: %d, want %d", got, DefaultCopyBytes)
	}
}

// socketPair returns two connected, pollable Unix sockets, closed when the
// test ends: the client's, as Dial returns it, and the fake agent's.
func socketPair(t *testing.T) (client, agent *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	client, agent = os.NewFile(uintptr(fds[0]), "client"), os.NewFile(uintptr(fds[1]), "agent")
	t.Cleanup(func() { client.Close(); agent.Close() })
	return client, agent
}

// fakeAgent answers one Copy request on conn as the agent does (see
// snippet's Agent.copy): it reads the request line; for CopyIn it reads
// the frames until the end (or until the connection fails) into in, then
// answers; for CopyOut it sends out's frames and answers. answer edits the
// Result.
func fakeAgent(conn *os.File, in *bytes.Buffer, out []byte, answer func(*Result)) <-chan *Request {
	got := make(chan *Request, 1)
	go func() {
		defer close(got)
		br := bufio.NewReader(conn)
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		var req Request
		if json.Unmarshal(line, &req) != nil || req.Copy == nil {
			return
		}
		res := &Result{Version: ProtocolVersion, Copied: &CopyStats{}}
		if req.Copy.Op == CopyIn {
			if err := readFrames(br, in); err != nil {
				res.ExitCode, res.Error = -1, "copy: "+err.Error()
			}
		} else if out != nil {
			writeFrames(conn, bytes.NewReader(out))
		}
		if answer != nil {
			answer(res)
		}
		json.NewEncoder(conn).Encode(res)
		got <- &req
	}()
	return got
}

// TestCopyConn: a copy each way through a fake agent carries the stream
// and the agent's Result; a refused CopyOut's Result comes first; an agent
// that does not set Copied cannot copy (ErrNoCopy).
func TestCopyConn(t *testing.T) {
	data := make([]byte, 2*maxFrame+99)
	rand.Read(data)
	t.Run("in", func(t *testing.T) {
		client, agent := socketPair(t)
		var in bytes.Buffer
		got := fakeAgent(agent, &in, nil, nil)
		c := &Copy{Op: CopyIn, Path: "/tmp/d", Into: true, MaxBytes: 1 << 20}
		res, err := CopyConn(t.Context(), client, c, bytes.NewReader(data), nil)
		if err != nil || res.Error != "" {
			t.Fatalf("CopyConn: %+v, %v", res, err)
		}
		req := <-got
		if req == nil || *req.Copy != *c {
			t.Errorf("the agent got %+v, want %+v", req, c)
		}
		if !bytes.Equal(in.Bytes(), data) {
			t.Errorf("the agent got %d bytes, not the %d sent", in.Len(), len(data))
		}
	})
	t.Run("out", func(t *testing.T) {
		client, agent := socketPair(t)
		fakeAgent(agent, nil, data, nil)
		var out bytes.Buffer
		res, err := CopyConn(t.Context(), client, &Copy{Op: CopyOut, Path: "/tmp/d"}, nil, &out)
		if err != nil || res.Error != "" {
			t.Fatalf("CopyConn: %+v, %v", res, err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Errorf("got %d bytes, not the %d sent", out.Len(), len(data))
		}
	})
	t.Run("out refused", func(t *testing.T) {
		client, agent := socketPair(t)
		fakeAgent(agent, nil, nil, func(r *Result) { r.ExitCode, r.Error = -1, "copy out of /: no" })
		var out bytes.Buffer
		res, err := CopyConn(t.Context(), client, &Copy{Op: CopyOut, Path: "/"}, nil, &out)
		if err != nil || res.Error != "copy out of /: no" || out.Len() != 0 {
			t.Fatalf("CopyConn: %+v, %v, %d bytes out", res, err, out.Len())
		}
	})
	t.Run("old agent", func(t *testing.T) {
		client, agent := socketPair(t)
		fakeAgent(agent, nil, nil, func(r *Result) { r.Copied, r.ExitCode, r.Error = nil, -1, "no language" })
		_, err := CopyConn(t.Context(), client, &Copy{Op: CopyOut, Path: "/tmp/x"}, nil, io.Discard)
		if !errors.Is(err, ErrNoCopy) {
			t.Fatalf("CopyConn: %v, want ErrNoCopy", err)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		client, _ := socketPair(t)
		if _, err := CopyConn(t.Context(), client, &Copy{Op: CopyIn, Path: "tmp"}, nil, nil); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("CopyConn: %v, want invalid argument", err)
		}
	})
}

// TestFrameWriter: what a FrameWriter is given, in writes of any size,
// comes out of a FrameReader whole, in frames of at most 1 MiB, and the
// stream ends where Close ended it.
func TestFrameWriter(t *testing.T) {
	data := make([]byte, 3<<20+7)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, chunk := range []int{1, 512, 32 << 10, maxFrame, maxFrame + 3, len(data)} {
		data := data
		if chunk == 1 {
			data = data[:maxFrame+7] // a full frame and a part, a byte a write
		}
		var stream bytes.Buffer
		fw := FrameWriter(&stream)
		for p := data; len(p) > 0; {
			n := min(chunk, len(p))
			if _, err := fw.Write(p[:n]); err != nil {
				t.Fatal(err)
			}
			p = p[n:]
		}
		if err := fw.Close(); err != nil {
			t.Fatal(err)
		}
		stream.WriteString("{}") // what follows the stream (the Result) is not read
		br := bufio.NewReader(&stream)
		got, err := io.ReadAll(FrameReader(br))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("chunks of %d: read %d bytes (%v), want %d", chunk, len(got), err, len(data))
		}
		if rest, _ := io.ReadAll(br); string(rest) != "{}" {
			t.Errorf("chunks of %d: after the stream %q, want the Result", chunk, rest)
		}
	}
}
