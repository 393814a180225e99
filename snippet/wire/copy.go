package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Copy operations.
const (
	// CopyIn extracts a tar stream that the client sends into Path.
	CopyIn = "in"
	// CopyOut sends Path as a tar stream to the client.
	CopyOut = "out"
)

// Bounds of a Copy.
const (
	// DefaultCopyBytes bounds a copy's files' contents when MaxBytes is 0.
	DefaultCopyBytes = 1 << 30
	// MaxCopyBytes is the largest MaxBytes.
	MaxCopyBytes = 64 << 30
	// maxFrame is the largest frame of a copy's stream.
	maxFrame = 1 << 20
	// CopyTimeout bounds a whole copy.
	CopyTimeout = 30 * time.Minute
)

// Copy asks the agent to copy files into the sandbox or out of it (flmbox
// cp), as the snippets' user, without following a link a snippet planted
// (see package internal/safetar).
//
// After the request, the tar stream goes on the connection in frames: a
// frame is the byte 'D', a 4-byte big-endian length (at most 1 MiB) and
// that many bytes; the byte 'E' ends the stream. For CopyIn the client
// sends the frames, then reads the Result; for CopyOut the agent sends the
// frames, then the Result. A Result may come first (a refused request: it
// starts with '{'); it carries Copied, which an agent that cannot copy does
// not set.
type Copy struct {
	// Op is CopyIn or CopyOut.
	Op string `json:"op"`
	// Path is absolute and clean. CopyIn: where the stream's top-level
	// entry goes: into Path if it is a directory, else as Path (its parent
	// must be one); the agent takes only paths under its copy directory
	// (/tmp). CopyOut: what is copied out (a file, a link or a directory
	// tree), named by its base name in the stream.
	Path string `json:"path"`
	// Into says, for CopyIn, that Path must be a directory, and that the
	// stream is extracted into it as it is (several top-level entries).
	Into bool `json:"into,omitempty"`
	// MaxBytes bounds the files' contents together (0: DefaultCopyBytes).
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// HandOut is Request.HandOut, for a copy.
	HandOut string `json:"hand_out,omitempty"`
}

// CopyStats counts what a copy carried.
type CopyStats struct {
	Bytes int64 `json:"bytes"` // of the tar stream
	// Kind says what kind of failure Result.Error is: one of the Copy*
	// kinds below; "" for another failure, or from an agent of before it
	// (a client takes it for an invalid argument).
	Kind string `json:"kind,omitempty"`
}

// Kinds of a failed copy (CopyStats.Kind), for the client to map to its
// error kinds (errdefs).
const (
	// CopyNotFound: the path copied out, or the directory copied into, is
	// not there.
	CopyNotFound = "not_found"
	// CopyNoSpace: the sandbox's filesystem is full (ENOSPC, EDQUOT).
	CopyNoSpace = "no_space"
	// CopyPermissionDenied: the sandbox's user may not read or write it.
	CopyPermissionDenied = "permission_denied"
	// CopyTooLarge: past the copy's MaxBytes.
	CopyTooLarge = "too_large"
	// CopyExists: a directory is in the way of a file or link.
	CopyExists = "already_exists"
)

func (c *Copy) validate() error {
	switch {
	case c.Op != CopyIn && c.Op != CopyOut:
		return fmt.Errorf("copy %q: want %s or %s", c.Op, CopyIn, CopyOut)
	case !strings.HasPrefix(c.Path, "/") || path.Clean(c.Path) != c.Path || strings.IndexByte(c.Path, 0) >= 0:
		return fmt.Errorf("copy path %q: want an absolute, clean path", c.Path)
	case c.MaxBytes < 0 || c.MaxBytes > MaxCopyBytes:
		return fmt.Errorf("copy max bytes %d: want 0 (the default, %d) up to %d", c.MaxBytes, DefaultCopyBytes, int64(MaxCopyBytes))
	}
	return nil
}

// Limit is MaxBytes with its default filled in.
func (c *Copy) Limit() int64 {
	if c.MaxBytes == 0 {
		return DefaultCopyBytes
	}
	return c.MaxBytes
}

// errResultFirst is readFrames' error when a Result comes before the end
// of the stream.
var errResultFirst = errors.New("a result in place of the stream")

// ErrNoCopy is in the error of a copy to an agent that cannot copy.
var ErrNoCopy = fmt.Errorf("the sandbox's agent cannot copy files: %w", ErrProtocolVersion)

// CopyConn runs a Copy request on conn, a connection from Dial: for
// CopyIn it sends the tar stream read from r, for CopyOut it writes the
// stream to w. It returns the agent's Result, whose Error says why a copy
// failed on the agent's side. It does not close conn.
func CopyConn(ctx context.Context, conn *os.File, c *Copy, r io.Reader, w io.Writer) (*Result, error) {
	req := &Request{Version: ProtocolVersion, Copy: c}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(CopyTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	enc := json.NewEncoder(conn)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return nil, agentGone("send the request", err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	var res *Result
	var err error
	if c.Op == CopyIn {
		sent := make(chan error, 1)
		go func() {
			err := writeFrames(conn, r)
			var rerr *readError
			if errors.As(err, &rerr) {
				// The stream failed on this side: the agent reads EOF
				// before the end of the stream, fails the copy and answers.
				closeWrite(conn)
			}
			sent <- err
		}()
		res, err = readCopyResult(br)
		var serr error
		select {
		case serr = <-sent:
		case <-ctx.Done(): // the reader may block for ever (a stdin that sends nothing)
		}
		var rerr *readError
		if errors.As(serr, &rerr) {
			return nil, fmt.Errorf("copy: %w", rerr.err) // why the agent failed: what it read was cut short
		}
		if err == nil && res.Error == "" && serr != nil {
			err = fmt.Errorf("send the archive: %w", serr)
		}
	} else {
		// The Result comes after the stream, or in its place if the agent
		// refused the copy or failed while sending it.
		if err = readFrames(br, w); err == nil || errors.Is(err, errResultFirst) {
			res, err = readCopyResult(br)
		}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("copy: %w", context.Cause(ctx))
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// readCopyResult reads the Result of a copy.
func readCopyResult(r io.Reader) (*Result, error) {
	var res Result
	if err := json.NewDecoder(io.LimitReader(r, 64<<10)).Decode(&res); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("the sandbox's agent did not finish the copy within %s: %w", CopyTimeout, errdefs.ErrUnavailable)
		}
		return nil, agentGone("read the answer", err)
	}
	if res.Version != ProtocolVersion || res.Copied == nil {
		return nil, ErrNoCopy
	}
	return &res, nil
}

// writeFrames sends r as frames, then the end of the stream.
func writeFrames(w io.Writer, r io.Reader) error {
	bw := bufio.NewWriterSize(w, maxFrame+5)
	buf := make([]byte, maxFrame)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			var hdr [5]byte
			hdr[0] = 'D'
			binary.BigEndian.PutUint32(hdr[1:], uint32(n))
			bw.Write(hdr[:])
			if _, werr := bw.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			bw.Flush()
			return &readError{err} // no end: the agent fails the copy
		}
	}
	bw.WriteByte('E')
	return bw.Flush()
}

// FrameWriter returns a writer that sends what is written to it to w as
// frames of up to 1 MiB; Close sends what it holds and the end of the
// stream (not closing w). It is for a sender that produces the stream by
// writing (tar.Writer), without a pipe between it and writeFrames.
func FrameWriter(w io.Writer) io.WriteCloser {
	return &frameWriter{w: w, buf: make([]byte, 5, maxFrame+5)}
}

type frameWriter struct {
	w   io.Writer
	buf []byte // a frame's header, then its bytes
	err error
}

func (f *frameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && f.err == nil {
		k := min(len(p), cap(f.buf)-len(f.buf))
		f.buf = append(f.buf, p[:k]...)
		p, n = p[k:], n+k
		if len(f.buf) == cap(f.buf) {
			f.flush()
		}
	}
	return n, f.err
}

// flush sends the frame held, if any.
func (f *frameWriter) flush() {
	if len(f.buf) == 5 || f.err != nil {
		return
	}
	f.buf[0] = 'D'
	binary.BigEndian.PutUint32(f.buf[1:5], uint32(len(f.buf)-5))
	_, f.err = f.w.Write(f.buf)
	f.buf = f.buf[:5]
}

func (f *frameWriter) Close() error {
	f.flush()
	if f.err == nil {
		_, f.err = f.w.Write([]byte{'E'})
	}
	return f.err
}

// readError is writeFrames' error when its reader failed.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// readFrames writes the frames read from r to w until the end of the
// stream.
func readFrames(r *bufio.Reader, w io.Writer) error {
	for {
		tag, err := r.ReadByte()
		if err != nil {
			return agentGone("read the archive", err)
		}
		switch tag {
		case '\n':
			continue // what ends the request's JSON line
		case 'E':
			return nil
		case 'D':
		case '{':
			r.UnreadByte()
			return errResultFirst
		default:
			return fmt.Errorf("read the archive: a frame starts with %q", tag)
		}
		var n [4]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return agentGone("read the archive", err)
		}
		size := binary.BigEndian.Uint32(n[:])
		if size > maxFrame {
			return fmt.Errorf("read the archive: a frame of %d bytes, over %d", size, maxFrame)
		}
		if _, err := io.CopyN(w, r, int64(size)); err != nil {
			return fmt.Errorf("read the archive: %w", err)
		}
	}
}

// FrameReader returns a reader of the stream carried by the frames read
// from r: it reads EOF at the end of the stream, and an error if r ends
// first.
func FrameReader(r *bufio.Reader) io.Reader { return &frameReader{r: r} }

type frameReader struct {
	r    *bufio.Reader
	left uint32 // of the current frame
	end  bool
}

func (f *frameReader) Read(p []byte) (int, error) {
	for f.left == 0 {
		if f.end {
			return 0, io.EOF
		}
		tag, err := f.r.ReadByte()
		if err != nil {
			return 0, agentGone("read the archive", err)
		}
		switch tag {
		case '\n':
			continue
		case 'E':
			f.end = true
			continue
		case 'D':
		default:
			return 0, fmt.Errorf("read the archive: a frame starts with %q", tag)
		}
		var n [4]byte
		if _, err := io.ReadFull(f.r, n[:]); err != nil {
			return 0, agentGone("read the archive", err)
		}
		if f.left = binary.BigEndian.Uint32(n[:]); f.left > maxFrame {
			return 0, fmt.Errorf("read the archive: a frame of %d bytes, over %d", f.left, maxFrame)
		}
	}
	if uint32(len(p)) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= uint32(n)
	if err == io.EOF {
		err = agentGone("read the archive", io.ErrUnexpectedEOF)
	}
	return n, err
}
