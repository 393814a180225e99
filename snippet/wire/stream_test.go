package wire

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestCallbackStream(t *testing.T) {
	frame := func(s string) string {
		b := make([]byte, CallbackHeader)
		PutCallbackHeader(b, len(s))
		return string(b) + s
	}
	for _, tc := range []struct {
		name, in, want string
		err            error
		rest           string // left for the next stream
	}{
		{name: "frames", in: frame("hello, ") + frame("") + frame("world") + "E" + "next", want: "hello, world", rest: "next"},
		{name: "empty", in: "E", want: ""},
		{name: "cut in a frame", in: frame("hello")[:7], want: "he", err: io.ErrUnexpectedEOF},
		{name: "cut in a header", in: frame("hello")[:3], err: io.ErrUnexpectedEOF},
		{name: "no end", in: frame("hi"), want: "hi", err: io.ErrUnexpectedEOF},
		{name: "bad tag", in: "X", err: errors.New("a frame starts with")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := bufio.NewReader(strings.NewReader(tc.in))
			var got strings.Builder
			_, err := io.Copy(&got, NewCallbackStream(r))
			switch {
			case got.String() != tc.want:
				t.Fatalf("read %q, want %q", got.String(), tc.want)
			case tc.err == nil && err != nil,
				tc.err != nil && (err == nil || !errors.Is(err, tc.err) && !strings.Contains(err.Error(), tc.err.Error())):
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if rest, _ := io.ReadAll(r); tc.err == nil && string(rest) != tc.rest {
				t.Fatalf("left %q, want %q", rest, tc.rest)
			}
		})
	}
}
