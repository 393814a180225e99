package runcmd

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Exit statuses of flmbox run besides the snippet's own, as docker and
// podman use them.
const (
	ExitTimeout      = 124 // the snippet timed out
	ExitFlmboxFailed = 125 // flmbox itself failed
	ExitNotFound     = 127 // the snippet's interpreter or shell is not in the image, as a shell's "command not found"
)

// JSON is `flmbox run --json`'s object. stdout and stderr are always an
// exact prefix of what the snippet wrote: all of it, or, when it wrote more
// than --max-output allows (stdout_truncated), its first half, with its
// last half in stdout_tail and stdout_bytes-len(stdout)-len(stdout_tail)
// bytes left out between the two. Output that is not valid UTF-8 is carried
// twice: with invalid bytes replaced by U+FFFD, and exactly in
// stdout_base64 (stdout_tail_base64 for a tail). stderr (its tail, if
// truncated) ends with why flmbox killed the snippet, if it did (as
// timed_out or oom_killed say), in the words plain mode prints, or with why
// flmbox could not run it.
type JSON struct {
	ExitCode         int     `json:"exit_code"`
	Stdout           string  `json:"stdout"`
	Stderr           string  `json:"stderr"`
	StdoutBase64     string  `json:"stdout_base64,omitempty"`
	StderrBase64     string  `json:"stderr_base64,omitempty"`
	StdoutTail       string  `json:"stdout_tail,omitempty"`
	StderrTail       string  `json:"stderr_tail,omitempty"`
	StdoutTailBase64 string  `json:"stdout_tail_base64,omitempty"`
	StderrTailBase64 string  `json:"stderr_tail_base64,omitempty"`
	StdoutBytes      int64   `json:"stdout_bytes"`
	StderrBytes      int64   `json:"stderr_bytes"`
	StdoutTruncated  bool    `json:"stdout_truncated"`
	StderrTruncated  bool    `json:"stderr_truncated"`
	TimedOut         bool    `json:"timed_out"`
	OOMKilled        bool    `json:"oom_killed"`
	Interrupted      bool    `json:"interrupted"`
	Signal           string  `json:"signal,omitempty"`
	DurationMS       float64 `json:"duration_ms"`
	// Callbacks is set for a call with --callback.
	Callbacks *Callbacks `json:"callbacks,omitempty"`
	// Resumed says that the sandbox was suspended, and resumed for the
	// call.
	Resumed bool `json:"resumed,omitempty"`
}

// Result is a call's outcome as the flmbox command prints it: the agent's
// answer (FromWire), or package sandbox's Result (flmbox-core).
type Result struct {
	ExitCode                         int
	Stdout, Stderr                   Output
	TimedOut, OOMKilled, Interrupted bool
	Signal                           string
	DurationMS                       float64
	Callbacks                        *Callbacks
	// Error is why flmbox could not run the snippet (ExitCode -1).
	Error string
	// Missing, with Error, says that the snippet's program (interpreter,
	// shell) is not in the image: the command exits ExitNotFound.
	Missing bool
}

// Output is what a snippet wrote to one stream: Data, an exact prefix of
// it, and when it was Truncated its Tail; Total bytes in all.
type Output struct {
	Data, Tail []byte
	Total      int64
	Truncated  bool
}

// FromWire is the agent's answer res as the command prints it.
func FromWire(res *wire.Result) *Result {
	if res == nil {
		return nil
	}
	out := &Result{ExitCode: res.ExitCode, Stdout: Output(res.Stdout), Stderr: Output(res.Stderr),
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, Interrupted: res.Interrupted, Signal: res.Signal,
		DurationMS: res.DurationMS, Error: res.Error, Missing: res.Missing}
	if cb := res.Callbacks; cb != nil {
		out.Callbacks = &Callbacks{Connections: cb.Connections, Refused: cb.Refused, BytesIn: cb.BytesIn, BytesOut: cb.BytesOut}
	}
	return out
}

// Callbacks counts a call's callback connections:
// those forwarded to the host's socket, those refused (closed at once:
// over --callback-conns, not taken by the host's socket in time, or made
// by a process outside the call), and the bytes forwarded from the host to
// the snippet (in) and from the snippet to the host (out).
type Callbacks struct {
	Connections int   `json:"connections"`
	Refused     int   `json:"refused"`
	BytesIn     int64 `json:"bytes_in"`
	BytesOut    int64 `json:"bytes_out"`
}

// ToJSON returns res as `flmbox run --json` prints it; an infrastructure
// error (res.Error) is appended to stderr (AppendStderr).
func ToJSON(res *Result) JSON {
	out := JSON{ExitCode: res.ExitCode, StdoutBytes: res.Stdout.Total, StderrBytes: res.Stderr.Total,
		StdoutTruncated: res.Stdout.Truncated, StderrTruncated: res.Stderr.Truncated,
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, Interrupted: res.Interrupted, Signal: res.Signal, DurationMS: res.DurationMS}
	out.Stdout, out.StdoutBase64 = jsonText(res.Stdout.Data)
	out.Stderr, out.StderrBase64 = jsonText(res.Stderr.Data)
	if res.Stdout.Truncated {
		out.StdoutTail, out.StdoutTailBase64 = jsonText(res.Stdout.Tail)
	}
	if res.Stderr.Truncated {
		out.StderrTail, out.StderrTailBase64 = jsonText(res.Stderr.Tail)
	}
	out.Callbacks = res.Callbacks
	out.AppendStderr(res.Error)
	return out
}

// AppendStderr appends flmbox's words s to the end of stderr as the object
// carries it: to stderr_tail if stderr was truncated, else to stderr. The
// base64 twins keep the snippet's bytes alone.
func (j *JSON) AppendStderr(s string) {
	if j.StderrTruncated {
		j.StderrTail += s
	} else {
		j.Stderr += s
	}
}

// jsonText is b as a JSON string (invalid UTF-8 replaced by U+FFFD) and,
// if it is not valid UTF-8, exactly in base64.
func jsonText(b []byte) (text, b64 string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), base64.StdEncoding.EncodeToString(b)
}

// Print writes res to stdout and stderr, as JSON if asJSON, and returns
// flmbox run's exit status: the snippet's (137 if it was killed because the
// sandbox ran out of memory, said on stderr), ExitTimeout if it timed out
// (after timeout), ExitFlmboxFailed if flmbox could not run it,
// ExitInterrupted if it was interrupted (PrintInterrupted has the signal's
// status). msg, if not empty, is for the caller to print as "flmbox: msg".
func Print(stdout, stderr io.Writer, res *Result, asJSON bool, timeout time.Duration) (code int, msg string, err error) {
	return PrintResumed(stdout, stderr, res, asJSON, timeout, false)
}

// PrintResumed is Print that also says, with --json, whether the sandbox
// was resumed for the call ("resumed").
func PrintResumed(stdout, stderr io.Writer, res *Result, asJSON bool, timeout time.Duration, resumed bool) (code int, msg string, err error) {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		out := ToJSON(res)
		out.Resumed = resumed
		if res.Error == "" && !res.Interrupted {
			out.AppendStderr(KillNote(res, timeout)) // as plain mode says it, below
		}
		if err := enc.Encode(out); err != nil {
			return 0, "", err
		}
	} else {
		stdout.Write(res.Stdout.Data)
		stdout.Write(res.Stdout.Tail)
		stderr.Write(res.Stderr.Data)
		stderr.Write(res.Stderr.Tail)
		io.WriteString(stderr, TruncationNote("stdout", res.Stdout))
		io.WriteString(stderr, TruncationNote("stderr", res.Stderr))
	}
	if res.Interrupted {
		return ExitInterrupted, "", nil // as a shell says nothing of a Ctrl-C
	}
	if res.Error != "" && res.Missing {
		return ExitNotFound, "run snippet: " + res.Error, nil
	}
	if res.Error != "" {
		return ExitFlmboxFailed, "run snippet: " + res.Error, nil
	}
	if !asJSON {
		io.WriteString(stderr, KillNote(res, timeout))
	}
	if res.TimedOut {
		return ExitTimeout, "", nil
	}
	return res.ExitCode, "", nil
}

// TruncationNote is the line that says how much of a stream (named name)
// a truncated output left out, and where: plain mode writes the first
// half (Data) and the last (Tail) one after the other. "" if nothing was
// left out.
func TruncationNote(name string, o Output) string {
	if !o.Truncated {
		return ""
	}
	left := o.Total - int64(len(o.Data)) - int64(len(o.Tail))
	return fmt.Sprintf("flmbox: %s: %d bytes left out between the first %d and the last %d (a larger --max-output keeps more)\n",
		name, left, len(o.Data), len(o.Tail))
}

// KillNote is the line that says why flmbox killed a snippet that ran out
// of time (after timeout) or of the sandbox's memory, or "".
func KillNote(res *Result, timeout time.Duration) string {
	switch {
	case res.TimedOut:
		return fmt.Sprintf("flmbox: the snippet timed out after %s and was killed\n", timeout)
	case res.OOMKilled:
		return "flmbox: the snippet was killed: the sandbox was running out of memory (its processes and its files under /tmp count together; flmbox sandbox create --memory sets the limit)\n"
	}
	return ""
}

// CallbackNote is the line that says how many of a call's callback
// connections were refused, if any, for a call whose limit was maxConns
// connections.
func CallbackNote(res *Result, maxConns int) string {
	cb := res.Callbacks
	if cb == nil || cb.Refused == 0 {
		return ""
	}
	conns := "connections"
	if cb.Refused == 1 {
		conns = "connection"
	}
	if cb.Connections >= maxConns {
		return fmt.Sprintf("flmbox: %d callback %s refused: over the limit of %d per call (--callback-conns)\n", cb.Refused, conns, maxConns)
	}
	return fmt.Sprintf("flmbox: %d callback %s refused: not accepted by the host's socket, or made from outside the call's processes\n", cb.Refused, conns)
}
