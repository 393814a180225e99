package instance

import (
	"time"

	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/flmbox/flmbox/sandbox"
)

// The size of a task's output. Flame carries it in one gRPC message from
// the instance to its executor, from there to its session manager, and to
// the client in a Task message that also holds the task's input; each of
// them takes 4 MiB, gRPC's default. flmexec's data costs 2 to 4 bytes of
// JSON per byte of stdout ("255,"), a JSON string up to 6 ("\u0001").
const (
	// MaxMessage is the largest gRPC message that Flame's executor, its
	// session manager and its Python client take (gRPC's default).
	MaxMessage = 4 << 20
	// messageSlack is what a Task message holds besides its input and
	// output: ids, state, times, events.
	messageSlack = 64 << 10
	// TaskMaxData is the most of stdout that data may hold: at 4 bytes of
	// output per byte at the least (data and stdout together), no more
	// fits in MaxMessage.
	TaskMaxData = MaxMessage / 4
	// TaskMaxOutput is how much of each stream a task asks the agent to
	// keep: the first TaskMaxData bytes and the last TaskMaxData (see
	// sandbox.Output).
	TaskMaxOutput = 2 * TaskMaxData
	// TaskMaxStderr is the most of stderr that stderr holds.
	TaskMaxStderr = 64 << 10
	// TaskMaxTail is the most that stdout_tail and stderr_tail hold of
	// the last bytes of a truncated stream.
	TaskMaxTail = 16 << 10
)

// Output is a task's output: flmexec's {"data": stdout bytes}, which
// Flame's Python client reads (bytes(data)), and what flmexec never gave.
//
// Data is all of stdout when the output fits in one gRPC message of
// MaxMessage bytes with the task's input (see outputBudget), else the
// longest prefix of it that does (ending between two characters), and
// never holds anything but the snippet's bytes: for a task whose input is
// small, over 750 KiB of text, at least 430 KiB whatever the bytes.
// StdoutTruncated then says so, StdoutBytes how long stdout was, and
// StdoutTail holds its last bytes. Stderr is kept the same way, its first
// TaskMaxStderr bytes and its last TaskMaxTail.
type Output struct {
	// Data is the snippet's stdout, or a prefix of it, as an array of
	// numbers.
	Data     Bytes `json:"data"`
	ExitCode int   `json:"exit_code"`
	// Stdout is Data as text (invalid UTF-8 replaced by U+FFFD); Stderr
	// the first TaskMaxStderr bytes of stderr, as text.
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// StdoutTail and StderrTail, when the stream is truncated, are its
	// last bytes (up to TaskMaxTail, after those that Data or Stderr
	// hold), as text.
	StdoutTail string `json:"stdout_tail,omitempty"`
	StderrTail string `json:"stderr_tail,omitempty"`
	// StdoutBytes and StderrBytes are the sizes of the whole streams.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// StdoutTruncated says that Data is a prefix of stdout, not all of it;
	// StderrTruncated the same of Stderr.
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	TimedOut        bool    `json:"timed_out"`
	OOMKilled       bool    `json:"oom_killed"`
	DurationMS      float64 `json:"duration_ms"`
}

// outputBudget is the most bytes a task's output may take when its input
// took input bytes: the client gets both in one message. An input too
// large for that (Flame cannot deliver its output anyway) leaves the
// output a quarter of MaxMessage.
func outputBudget(input int) int {
	return max(MaxMessage-messageSlack-input, MaxMessage/4)
}

// newOutput returns res as a task's output of at most budget bytes of JSON
// (see Output), and that JSON.
func newOutput(res *sandbox.Result, budget int) (*Output, []byte) {
	out := &Output{ExitCode: res.ExitCode, StdoutBytes: res.Stdout.Total, StderrBytes: res.Stderr.Total,
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, DurationMS: float64(res.Duration) / float64(time.Millisecond)}
	head, tail, cut := clip(res.Stderr, TaskMaxStderr)
	out.Stderr, out.StderrTail, out.StderrTruncated = validUTF8(head), validUTF8(tail), cut
	// All of stdout that the agent kept, if it fits (a byte takes 4 bytes
	// at the least, data and stdout together).
	if 4*len(res.Stdout.Data) <= budget {
		out.setStdout(res.Stdout, len(res.Stdout.Data))
		if b := marshal(out); len(b) <= budget {
			return out, b
		}
	}
	// Else the prefix that fits beside the rest, with room for the
	// longest tail, that of an empty prefix (a shorter one, a suffix of
	// it, takes at most a U+FFFD more where it starts in a character).
	out.setStdout(res.Stdout, 0)
	room := budget - len(marshal(out)) - 2*utf8.UTFMax
	n := prefixFits(res.Stdout.Data, room)
	out.setStdout(res.Stdout, n)
	b := marshal(out)
	// Should encoding/json take more than nextChar counts, less data.
	for len(b) > budget && n > 0 {
		room -= len(b) - budget
		n = prefixFits(res.Stdout.Data, room)
		out.setStdout(res.Stdout, n)
		b = marshal(out)
	}
	return out, b
}

// setStdout sets data and stdout to the first n bytes that the agent kept
// of stdout, and the tail.
func (o *Output) setStdout(stdout sandbox.Output, n int) {
	head, tail, cut := clip(stdout, n)
	o.Data, o.Stdout, o.StdoutTail, o.StdoutTruncated = Bytes(head), validUTF8(head), validUTF8(tail), cut
}

// clip returns the first head bytes of o, and, if that is not all of the
// stream, its last bytes (up to TaskMaxTail, none of those of head) and
// true.
func clip(o sandbox.Output, head int) ([]byte, []byte, bool) {
	if !o.Truncated && len(o.Data) <= head {
		return o.Data, nil, false
	}
	h, rest := o.Data[:min(head, len(o.Data))], o.Data[min(head, len(o.Data)):]
	if o.Truncated { // the stream's end is the agent's tail
		rest = o.Tail
	}
	return h, rest[max(len(rest)-TaskMaxTail, 0):], true
}

// prefixFits returns the length of the longest prefix of b, ending
// between two characters, that takes at most room bytes of JSON as data
// (numbers) and as stdout (a string of valid UTF-8).
func prefixFits(b []byte, room int) int {
	n, invalid := 0, false
	for n < len(b) {
		size, cost, inv := nextChar(b[n:], invalid)
		if room -= cost; room < 0 {
			break
		}
		n, invalid = n+size, inv
	}
	return n
}

// nextChar returns the size of b's first character (an invalid byte is
// one), what it takes of JSON as data and in a string (encoding/json's
// escapes, HTML not escaped; a run of invalid bytes is one U+FFFD, as
// strings.ToValidUTF8 has it), and whether it is an invalid byte. invalid
// says that the byte before it was.
func nextChar(b []byte, invalid bool) (size, cost int, inv bool) {
	r, size := utf8.DecodeRune(b)
	for _, c := range b[:size] {
		cost += numberSize(c)
	}
	switch {
	case r == utf8.RuneError && size == 1:
		if !invalid {
			cost += len("\uFFFD")
		}
		return size, cost, true
	case r == '"', r == '\\', r == '\n', r == '\r', r == '\t', r == '\b', r == '\f':
		cost += 2
	case r < 0x20, r == '\u2028', r == '\u2029':
		cost += len(`\u0000`)
	default:
		cost += size
	}
	return size, cost, false
}

// numberSize is what byte c takes in data: its digits and a comma.
func numberSize(c byte) int {
	switch {
	case c < 10:
		return 2
	case c < 100:
		return 3
	}
	return 4
}

// marshal is o's JSON, HTML not escaped (as stringSize counts).
func marshal(o *Output) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(o) // an Output always encodes: numbers, valid strings
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// validUTF8 is b as a string, invalid bytes replaced (data keeps them).
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
