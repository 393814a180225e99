package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/sandbox"
)

// maxBatchInput bounds a batch's input.
const maxBatchInput = 80 << 20

// batchInput is `flmbox run --batch`'s input. Each code takes its own
// language and timeout, else the batch's, else --language's and --timeout's
// (whose defaults are python and 30s).
type batchInput struct {
	Language string       `json:"language"`
	Timeout  batchTimeout `json:"timeout"`
	Codes    []batchItem  `json:"codes"`
}

// batchItem is a code string or {"language", "code", "timeout"}.
type batchItem struct {
	Language string       `json:"language"`
	Code     string       `json:"code"`
	Timeout  batchTimeout `json:"timeout"`
}

func (b *batchItem) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		return json.Unmarshal(data, &b.Code)
	}
	type plain batchItem
	return json.Unmarshal(data, (*plain)(b))
}

// batchTimeout is a batch's "timeout": a number of seconds (30, 0.5) or a
// string that time.ParseDuration reads ("1.5s", "2m"), as --timeout does.
// Absent, null or 0, it is not set.
type batchTimeout struct {
	raw string // as written, for messages; "" if not set
}

func (b *batchTimeout) UnmarshalJSON(data []byte) error {
	if s := string(data); s != "null" && s != "0" {
		b.raw = s
	}
	return nil
}

// duration reads the timeout; it is checked against wire's bounds later.
func (b batchTimeout) duration() (time.Duration, error) {
	bad := fmt.Errorf("timeout %s: want a number of seconds or a duration such as \"1.5s\", more than 0 and at most %s", b.raw, sandbox.MaxTimeout)
	var s string
	if err := json.Unmarshal([]byte(b.raw), &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > sandbox.MaxTimeout {
			return 0, bad
		}
		return d, nil
	}
	var secs float64
	if err := json.Unmarshal([]byte(b.raw), &secs); err != nil || secs <= 0 || secs > sandbox.MaxTimeout.Seconds() {
		return 0, bad
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// batchResult is one element of the output array, in input order: the
// fields of run --json's object that a batch keeps. stdout and stderr are
// exact prefixes, with stdout_tail and stderr_tail when the output was
// truncated, as in run --json; stderr (its tail, if truncated) ends with
// why flmbox killed the snippet, if it did; output that is not valid UTF-8
// is also carried exactly in the _base64 fields, as by run --json.
type batchResult struct {
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
	Callbacks *runcmd.Callbacks `json:"callbacks,omitempty"`
}

// runBatch runs `flmbox run --batch FILE` and prints the results as one
// JSON array, in input order.
func runBatch(c *cli.Context) error {
	if c.NArg() != 0 || c.IsSet("code") {
		return fmt.Errorf("--batch takes its codes from FILE, not from -c or arguments")
	}
	if c.Bool("reset") {
		return fmt.Errorf("--reset does not apply to --batch: with --image every snippet starts in a clean sandbox")
	}
	if c.Bool("interactive") {
		return fmt.Errorf("--interactive does not apply to --batch: its snippets take no stdin")
	}
	if c.IsSet("copy") {
		return fmt.Errorf("--copy does not apply to --batch: copy files in with a snippet of the batch, or run --copy first with --sandbox NAME")
	}
	// --json is allowed: a batch prints JSON anyway.
	reqs, err := readBatch(c, c.String("batch"))
	if err != nil {
		return err
	}
	var target sandbox.Target
	switch name, image := c.String("sandbox"), c.String("image"); {
	case (name == "") == (image == ""):
		return fmt.Errorf("give exactly one of --sandbox NAME and --image IMAGE")
	case name != "":
		target.Sandbox = name
	default:
		spec, err := specFrom(c)
		if err != nil {
			return err
		}
		target.Spec = &spec
	}
	m, err := openManager(c)
	if err != nil {
		return err
	}
	results, err := m.Batch(c.Context, target, reqs, c.Int("parallel"))
	if err != nil {
		return err
	}
	out := make([]batchResult, len(results))
	for i, r := range results {
		out[i] = batchElement(c.Context, r, reqs[i].Timeout)
	}
	enc := json.NewEncoder(c.App.Writer)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return err
	}
	if c.Context.Err() != nil { // Ctrl-C: what ran until then is printed
		return cli.Exit("", runcmd.InterruptStatus(c.Context))
	}
	return nil
}

// batchElement is r as the output array shows it. A snippet flmbox failed
// to run has exit_code -1 and the error in stderr; the stderr of one that
// flmbox killed ends with why (as timed_out or oom_killed say).
func batchElement(ctx context.Context, r sandbox.BatchResult, timeout time.Duration) batchResult {
	switch {
	case !r.Ran:
		return batchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: not run: %v", context.Cause(ctx))}
	case r.Err != nil:
		return batchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: %v", r.Err)}
	}
	j := runcmd.ToJSON(r.Result)
	if r.Result.Error != "" {
		j.ExitCode = -1
	} else {
		j.AppendStderr(runcmd.KillNote(r.Result, timeout))
	}
	return batchResult{ExitCode: j.ExitCode, Stdout: j.Stdout, Stderr: j.Stderr, StdoutBase64: j.StdoutBase64,
		StderrBase64: j.StderrBase64, StdoutTail: j.StdoutTail, StderrTail: j.StderrTail,
		StdoutTailBase64: j.StdoutTailBase64, StderrTailBase64: j.StderrTailBase64,
		StdoutTruncated: j.StdoutTruncated, StderrTruncated: j.StderrTruncated, TimedOut: j.TimedOut,
		OOMKilled: j.OOMKilled, Interrupted: j.Interrupted, DurationMS: j.DurationMS, Callbacks: j.Callbacks}
}

// readBatch parses and validates a batch; nothing runs if any of it is bad.
func readBatch(c *cli.Context, path string) ([]sandbox.Request, error) {
	r := c.App.Reader
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read batch: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxBatchInput+1))
	if err != nil {
		return nil, fmt.Errorf("read batch: %w", err)
	}
	if len(data) > maxBatchInput {
		return nil, fmt.Errorf("batch input is larger than %d bytes", maxBatchInput)
	}
	var in batchInput
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf(`parse batch: %w; want {"language": "python", "timeout": 30, "codes": ["...", {"code": "...", "timeout": "1.5s"}, ...]}`, err)
	}
	if n := len(in.Codes); n == 0 || n > sandbox.MaxBatch {
		return nil, fmt.Errorf("a batch holds 1 to %d codes, this one %d", sandbox.MaxBatch, n)
	}
	maxOut, err := parseSize("--max-output", c.String("max-output"))
	if err != nil {
		return nil, err
	}
	cb, err := callbackFrom(c) // the same for every snippet, each forwarded on its own
	if err != nil {
		return nil, err
	}
	var reqs []sandbox.Request
	for i, item := range in.Codes {
		lang := firstNonZero(item.Language, in.Language, c.String("language"))
		timeout := c.Duration("timeout")
		for _, t := range []batchTimeout{in.Timeout, item.Timeout} {
			if t.raw != "" {
				if timeout, err = t.duration(); err != nil {
					return nil, fmt.Errorf("code %d: %w", i, err)
				}
			}
		}
		if lang == "" {
			return nil, fmt.Errorf("code %d: no language: want python or shell", i)
		}
		req := sandbox.Request{Language: lang, Code: item.Code, Timeout: timeout, MaxOutput: maxOut, Env: listFlag(c, "env"), Callback: cb}
		if err := req.Validate(); err != nil {
			return nil, fmt.Errorf("code %d: %w", i, err)
		}
		reqs = append(reqs, req)
	}
	return reqs, nil
}

func firstNonZero(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}
