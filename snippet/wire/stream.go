package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frames of a framed standby connection (Event.Frames, Request.Frames): a
// standby connection that carries one of the snippet's connections after
// another, so that the host attaches no new connection per connection. On
// it, once the agent has written CallbackWake, each direction is a stream
// of data frames (CallbackData, a 4-byte big-endian length, as many bytes)
// ended by CallbackEnd, the EOF of that direction. When both directions
// have ended, the connection goes back to the call's standby connections
// and waits for the next CallbackWake. A connection that is cut (a limit,
// the call's end, an error) is closed, never reused.
const (
	CallbackData = 'D'
	CallbackEnd  = 'E'
	// CallbackHeader is the size of a data frame's header.
	CallbackHeader = 5
)

// PutCallbackHeader writes the header of a data frame of n bytes in
// b[:CallbackHeader].
func PutCallbackHeader(b []byte, n int) {
	b[0] = CallbackData
	binary.BigEndian.PutUint32(b[1:CallbackHeader], uint32(n))
}

// CallbackStream reads one direction's stream of frames from r: the data
// frames' bytes, then io.EOF at CallbackEnd, or io.ErrUnexpectedEOF if r
// ends first. A read that fails (a deadline) before a frame's header is
// whole consumes nothing of it, so it can be tried again.
type CallbackStream struct {
	r    *bufio.Reader
	left uint32 // of the current frame
	end  bool
}

// NewCallbackStream returns a reader of the stream of frames that r
// carries next.
func NewCallbackStream(r *bufio.Reader) *CallbackStream { return &CallbackStream{r: r} }

func (s *CallbackStream) Read(p []byte) (int, error) {
	for s.left == 0 {
		if s.end {
			return 0, io.EOF
		}
		tag, err := s.r.Peek(1)
		if err != nil {
			return 0, unexpected(err)
		}
		switch tag[0] {
		case CallbackEnd:
			s.r.Discard(1)
			s.end = true
			continue
		case CallbackData:
		default:
			return 0, fmt.Errorf("read a callback stream: a frame starts with %q", tag[0])
		}
		h, err := s.r.Peek(CallbackHeader)
		if err != nil {
			return 0, unexpected(err)
		}
		n := binary.BigEndian.Uint32(h[1:])
		if n > maxFrame {
			return 0, fmt.Errorf("read a callback stream: a frame of %d bytes, over %d", n, maxFrame)
		}
		s.r.Discard(CallbackHeader)
		s.left = n
	}
	if uint32(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.r.Read(p)
	s.left -= uint32(n)
	return n, unexpected(err)
}

// unexpected turns io.EOF in the middle of a stream into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
