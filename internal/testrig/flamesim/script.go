package flamesim

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/flmbox/flmbox/instance/flamepb"
)

// Task is a task's input as flamepy.tools.Sandbox makes it for a snippet
// (run_code, submit_code): flmexec's script.
type Task struct {
	// Language and Runtime are the Sandbox's (its SandboxAttr); an empty
	// Runtime is None, and left out.
	Language, Runtime string
	// Code is the snippet.
	Code string
	// Input is its stdin; nil is None.
	Input []byte
}

// JSON returns t as flamepy encodes it, byte for byte: Python's
// json.dumps of {"language", "code", "input"} and "runtime" if set, with
// its default separators (", " and ": ") and every character outside
// ASCII's printable ones escaped (\u00e9, a surrogate pair beyond U+FFFF).
// Invalid UTF-8 in Code becomes U+FFFD (a Python str holds none).
func (t Task) JSON() []byte {
	var b strings.Builder
	b.WriteString(`{"language": ` + pyString(t.Language) + `, "code": ` + pyString(t.Code) + `, "input": `)
	if t.Input == nil {
		b.WriteString("null")
	} else {
		b.WriteByte('[')
		for i, c := range t.Input {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Itoa(int(c)))
		}
		b.WriteByte(']')
	}
	if t.Runtime != "" {
		b.WriteString(`, "runtime": ` + pyString(t.Runtime))
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// pyString is s as Python's json.dumps writes a str (ensure_ascii).
func pyString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r >= ' ' && r <= '~':
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Script is Task{Language: language, Code: code}.JSON(): a snippet of a
// Sandbox with no runtime, without input.
func Script(language, code string) []byte {
	return Task{Language: language, Code: code}.JSON()
}

// Output is a task's output as `flmbox instance` answers it: flmexec's
// {"data": stdout as an array of byte numbers}, which flamepy decodes as
// bytes(data), and the rest of the snippet's result.
type Output struct {
	// Data is the snippet's stdout, byte for byte, or its first bytes
	// (StdoutTruncated).
	Data       []byte  `json:"data"`
	ExitCode   int     `json:"exit_code"`
	Stdout     string  `json:"stdout"` // Data as valid UTF-8
	Stderr     string  `json:"stderr"` // as valid UTF-8, or its first bytes
	TimedOut   bool    `json:"timed_out"`
	OOMKilled  bool    `json:"oom_killed"`
	DurationMS float64 `json:"duration_ms"`
	// StdoutBytes and StderrBytes are the sizes of the whole streams;
	// StdoutTruncated and StderrTruncated say that Data and Stderr hold
	// only their first bytes, StdoutTail and StderrTail their last ones
	// (as valid UTF-8).
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutTail      string `json:"stdout_tail"`
	StderrTail      string `json:"stderr_tail"`
}

// UnmarshalJSON reads the output's JSON; data must be null or an array of
// numbers 0 to 255. Keys it does not know are ignored.
func (o *Output) UnmarshalJSON(b []byte) error {
	type plain Output // without this method
	var v struct {
		plain
		Data []int `json:"data"` // shadows plain's
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*o = Output(v.plain)
	o.Data = nil
	if v.Data != nil {
		o.Data = make([]byte, len(v.Data))
	}
	for i, n := range v.Data {
		if n < 0 || n > 255 {
			return fmt.Errorf("data: byte %d is %d, not 0 to 255", i, n)
		}
		o.Data[i] = byte(n)
	}
	return nil
}

// Answer is what the Instance service answers: *flamepb.Result and
// *flamepb.TaskResult.
type Answer interface {
	GetReturnCode() int32
	GetMessage() string
}

// Check returns nil if a's return code is 0, else an error with its code
// and message.
func Check(a Answer) error {
	if a.GetReturnCode() == 0 {
		return nil
	}
	return fmt.Errorf("return code %d: %s", a.GetReturnCode(), a.GetMessage())
}

// DecodeOutput returns the output of a task that ran (its snippet may
// still have failed: see ExitCode); a task that did not run (Check) or an
// output that is not Output's JSON is an error.
func DecodeOutput(res *flamepb.TaskResult) (*Output, error) {
	if err := Check(res); err != nil {
		return nil, fmt.Errorf("the task did not run: %w", err)
	}
	var o Output
	if err := json.Unmarshal(res.GetOutput(), &o); err != nil {
		return nil, fmt.Errorf("decode the task's output %.200q: %w", res.GetOutput(), err)
	}
	return &o, nil
}
