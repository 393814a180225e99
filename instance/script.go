package instance

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Script is a task's input: flmexec's, as Flame's Python client sends it
// (JSON of Rust's serde: bytes are arrays of numbers), and a timeout.
type Script struct {
	// Language is "python" or "shell", in any case.
	Language string `json:"language"`
	// Runtime names the interpreter: a command in the image's PATH, such
	// as python3.11 for Python or bash for shell (default: python3, sh).
	// One the image lacks fails the task.
	Runtime string `json:"runtime,omitempty"`
	// Code is the snippet.
	Code string `json:"code"`
	// Input is the snippet's stdin (null: EOF at once).
	Input Bytes `json:"input"`
	// Timeout is the task's timeout in seconds (default: the session's).
	Timeout float64 `json:"timeout,omitempty"`
	// Env are environment variables of this task only, added to the
	// session's.
	Env map[string]string `json:"env,omitempty"`
}

// Bytes are bytes as serde's JSON has them: an array of numbers.
type Bytes []byte

// MarshalJSON writes b as an array of numbers.
func (b Bytes) MarshalJSON() ([]byte, error) {
	var out bytes.Buffer
	out.Grow(4*len(b) + 2)
	out.WriteByte('[')
	for i, c := range b {
		if i > 0 {
			out.WriteByte(',')
		}
		out.WriteString(strconv.Itoa(int(c)))
	}
	out.WriteByte(']')
	return out.Bytes(), nil
}

// UnmarshalJSON reads an array of numbers 0 to 255, or null.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = nil
		return nil
	}
	var ns []int
	if err := json.Unmarshal(data, &ns); err != nil {
		return fmt.Errorf("want an array of bytes: %w", err)
	}
	out := make([]byte, len(ns))
	for i, n := range ns {
		if n < 0 || n > 255 {
			return fmt.Errorf("byte %d is %d, not 0 to 255", i, n)
		}
		out[i] = byte(n)
	}
	*b = out
	return nil
}

// parseScript reads a task's input into a call, with the session's
// defaults.
func parseScript(input []byte, defaults taskDefaults) (sandbox.Request, error) {
	timeout := defaults.Timeout
	var sc Script
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return sandbox.Request{}, fmt.Errorf("task input: want a JSON script {\"language\", \"code\", \"input\"}: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	lang := strings.ToLower(sc.Language)
	if lang != wire.LanguagePython && lang != wire.LanguageShell {
		return sandbox.Request{}, fmt.Errorf("language %q: want python or shell: %w", sc.Language, errdefs.ErrInvalidArgument)
	}
	if sc.Timeout < 0 {
		return sandbox.Request{}, fmt.Errorf("timeout %g: want seconds, more than 0: %w", sc.Timeout, errdefs.ErrInvalidArgument)
	}
	if sc.Timeout > 0 {
		timeout = time.Duration(sc.Timeout * float64(time.Second))
	}
	req := sandbox.Request{Language: lang, Code: sc.Code, Timeout: timeout, MaxOutput: TaskMaxOutput,
		Stdin: sc.Input, Interpreter: cmp.Or(sc.Runtime, defaults.Runtime)}
	for _, k := range slices.Sorted(maps.Keys(sc.Env)) {
		req.Env = append(req.Env, k+"="+sc.Env[k])
	}
	if err := req.Validate(); err != nil {
		return sandbox.Request{}, fmt.Errorf("task input: %w", err)
	}
	return req, nil
}

// TaskMaxOutput is how much of stdout and of stderr a task's output keeps
// (the first and last halves): little enough that the output, whatever its
// bytes, fits in the 4 MiB that gRPC clients such as Flame's executor take
// by default (data as numbers, stdout and stderr as escaped JSON strings).
const TaskMaxOutput = 200 << 10

// Output is a task's output: flmexec's {"data": stdout bytes}, which
// Flame's Python client reads, and what flmexec never gave.
type Output struct {
	// Data is the snippet's stdout, as an array of numbers.
	Data       Bytes   `json:"data"`
	ExitCode   int     `json:"exit_code"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	TimedOut   bool    `json:"timed_out"`
	OOMKilled  bool    `json:"oom_killed"`
	DurationMS float64 `json:"duration_ms"`
	// StdoutTruncated and StderrTruncated say that the middle of an
	// output was left out (the agent's cap).
	StdoutTruncated bool `json:"stdout_truncated,omitempty"`
	StderrTruncated bool `json:"stderr_truncated,omitempty"`
}

func newOutput(res *wire.Result) *Output {
	return &Output{Data: Bytes(res.Stdout.Data), ExitCode: res.ExitCode,
		Stdout: validUTF8(res.Stdout.Data), Stderr: validUTF8(res.Stderr.Data),
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, DurationMS: res.DurationMS,
		StdoutTruncated: res.Stdout.Truncated, StderrTruncated: res.Stderr.Truncated}
}

// validUTF8 is b as a string, invalid bytes replaced (data keeps them).
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
