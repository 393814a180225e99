package runcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// What both binaries share of `flmbox run --batch`: its input, how each
// code's language and timeout are chosen, and each element of its output.

// MaxBatch is the most snippets a batch holds (package sandbox's
// MaxBatch, which a test of flmbox-core's keeps equal).
const MaxBatch = 64

// MaxBatchInput bounds a batch's input.
const MaxBatchInput = 80 << 20

// BatchInput is `flmbox run --batch`'s input. Each code takes its own
// language and timeout, else the batch's, else --language's and --timeout's
// (whose defaults are python and 30s).
type BatchInput struct {
	Language string       `json:"language"`
	Timeout  BatchTimeout `json:"timeout"`
	Codes    []BatchItem  `json:"codes"`
}

// BatchItem is a code string or {"language", "code", "timeout"}.
type BatchItem struct {
	Language string       `json:"language"`
	Code     string       `json:"code"`
	Timeout  BatchTimeout `json:"timeout"`
}

func (b *BatchItem) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		return json.Unmarshal(data, &b.Code)
	}
	type plain BatchItem
	return json.Unmarshal(data, (*plain)(b))
}

// BatchTimeout is a batch's "timeout": a number of seconds (30, 0.5) or a
// string that time.ParseDuration reads ("1.5s", "2m"), as --timeout does.
// Absent, null or 0, it is not set.
type BatchTimeout struct {
	raw string // as written, for messages; "" if not set
}

func (b *BatchTimeout) UnmarshalJSON(data []byte) error {
	if s := string(data); s != "null" && s != "0" {
		b.raw = s
	}
	return nil
}

// duration reads the timeout; it is checked against wire's bounds later.
func (b BatchTimeout) duration() (time.Duration, error) {
	bad := fmt.Errorf("timeout %s: want a number of seconds or a duration such as \"1.5s\", more than 0 and at most %s", b.raw, wire.MaxTimeout)
	var s string
	if err := json.Unmarshal([]byte(b.raw), &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > wire.MaxTimeout {
			return 0, bad
		}
		return d, nil
	}
	var secs float64
	if err := json.Unmarshal([]byte(b.raw), &secs); err != nil || secs <= 0 || secs > wire.MaxTimeout.Seconds() {
		return 0, bad
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// ParseBatch parses a batch's input (at most MaxBatchInput bytes, 1 to
// MaxBatch codes).
func ParseBatch(data []byte) (BatchInput, error) {
	var in BatchInput
	if len(data) > MaxBatchInput {
		return in, fmt.Errorf("batch input is larger than %d bytes", MaxBatchInput)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf(`parse batch: %w; want {"language": "python", "timeout": 30, "codes": ["...", {"code": "...", "timeout": "1.5s"}, ...]}`, err)
	}
	if n := len(in.Codes); n == 0 || n > MaxBatch {
		return in, fmt.Errorf("a batch holds 1 to %d codes, this one %d", MaxBatch, n)
	}
	return in, nil
}

// Item returns the language and the timeout of code i of the batch, given
// --language's and --timeout's values.
func (in BatchInput) Item(i int, language string, timeout time.Duration) (string, time.Duration, error) {
	item := in.Codes[i]
	lang := firstNonZero(item.Language, in.Language, language)
	for _, t := range []BatchTimeout{in.Timeout, item.Timeout} {
		if t.raw != "" {
			var err error
			if timeout, err = t.duration(); err != nil {
				return "", 0, fmt.Errorf("code %d: %w", i, err)
			}
		}
	}
	if lang == "" {
		return "", 0, fmt.Errorf("code %d: no language: want python or shell", i)
	}
	return lang, timeout, nil
}

func firstNonZero(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// BatchResult is one element of the output array, in input order: the
// fields of run --json's object that a batch keeps. stdout and stderr are
// exact prefixes, with stdout_tail and stderr_tail when the output was
// truncated, as in run --json; stderr (its tail, if truncated) ends with
// why flmbox killed the snippet, if it did; output that is not valid UTF-8
// is also carried exactly in the _base64 fields, as by run --json.
type BatchResult struct {
	ExitCode         int     `json:"exit_code"`
	Stdout           string  `json:"stdout"`
	Stderr           string  `json:"stderr"`
	StdoutBase64     string  `json:"stdout_base64,omitempty"`
	StderrBase64     string  `json:"stderr_base64,omitempty"`
	StdoutTail       string  `json:"stdout_tail,omitempty"`
	StderrTail       string  `json:"stderr_tail,omitempty"`
	StdoutTailBase64 string  `json:"stdout_tail_base64,omitempty"`
	StderrTailBase64 string  `json:"stderr_tail_base64,omitempty"`
	StdoutTruncated  bool    `json:"stdout_truncated,omitempty"`
	StderrTruncated  bool    `json:"stderr_truncated,omitempty"`
	TimedOut         bool    `json:"timed_out"`
	OOMKilled        bool    `json:"oom_killed"`
	Interrupted      bool    `json:"interrupted"`
	DurationMS       float64 `json:"duration_ms"`
	// Callbacks, with --callback: the snippet's own connections.
	Callbacks *Callbacks `json:"callbacks,omitempty"`
}

// BatchElement is a snippet's outcome as the output array shows it: not
// run (ran false; ctx, the batch's, says why), a failure of flmbox to run
// it (err: exit_code -1 and the error in stderr), or its result, whose
// stderr ends with why flmbox killed it (as timed_out or oom_killed say)
// and whose infrastructure error makes exit_code -1.
func BatchElement(ctx context.Context, ran bool, res *Result, err error, timeout time.Duration) BatchResult {
	switch {
	case !ran:
		return BatchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: not run: %v", context.Cause(ctx))}
	case err != nil:
		return BatchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: %v", err)}
	}
	j := ToJSON(res)
	if res.Error != "" {
		j.ExitCode = -1
	} else {
		j.AppendStderr(KillNote(res, timeout))
	}
	return BatchResult{ExitCode: j.ExitCode, Stdout: j.Stdout, Stderr: j.Stderr, StdoutBase64: j.StdoutBase64,
		StderrBase64: j.StderrBase64, StdoutTail: j.StdoutTail, StderrTail: j.StderrTail,
		StdoutTailBase64: j.StdoutTailBase64, StderrTailBase64: j.StderrTailBase64,
		StdoutTruncated: j.StdoutTruncated, StderrTruncated: j.StderrTruncated, TimedOut: j.TimedOut,
		OOMKilled: j.OOMKilled, Interrupted: j.Interrupted, DurationMS: j.DurationMS, Callbacks: j.Callbacks}
}

// PrintBatch prints a batch's results, one JSON array.
func PrintBatch(w io.Writer, out []BatchResult) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}
