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

// Bounds of a batch's input.
const (
	maxBatchInput  = 80 << 20
	maxTimeoutSecs = 24 * 60 * 60
)

// batchInput is `flmbox run --batch`'s input: codes share the batch's
// language and timeout; items set their own.
type batchInput struct {
	Language string      `json:"language"`
	Timeout  float64     `json:"timeout"` // seconds
	Codes    []batchItem `json:"codes"`
}

// batchItem is a code string or {"language", "code", "timeout"}.
type batchItem struct {
	Language string  `json:"language"`
	Code     string  `json:"code"`
	Timeout  float64 `json:"timeout"`
}

func (b *batchItem) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		return json.Unmarshal(data, &b.Code)
	}
	type plain batchItem
	return json.Unmarshal(data, (*plain)(b))
}

// batchResult is one element of the output array, in input order.
type batchResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
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
	return enc.Encode(out)
}

// batchElement is r as the output array shows it. A snippet flmbox failed
// to run has exit_code -1 and the error in stderr; an element has no
// timed_out field: its stderr says why flmbox killed it.
func batchElement(ctx context.Context, r sandbox.BatchResult, timeout time.Duration) batchResult {
	switch {
	case !r.Ran:
		return batchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: not run: %v", context.Cause(ctx))}
	case r.Err != nil:
		return batchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: %v", r.Err)}
	}
	j := runcmd.ToJSON(r.Result)
	if r.Result.Error != "" {
		return batchResult{ExitCode: -1, Stdout: j.Stdout, Stderr: j.Stderr}
	}
	return batchResult{ExitCode: r.Result.ExitCode, Stdout: j.Stdout, Stderr: j.Stderr + runcmd.KillNote(r.Result, timeout)}
}

// readBatch parses and validates a batch; nothing runs if any of it is bad.
func readBatch(c *cli.Context, path string) ([]sandbox.Request, error) {
	var r io.Reader = os.Stdin
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
		return nil, fmt.Errorf(`parse batch: %w; want {"language": "python", "timeout": 30, "codes": ["...", ...]}`, err)
	}
	if n := len(in.Codes); n == 0 || n > sandbox.MaxBatch {
		return nil, fmt.Errorf("a batch holds 1 to %d codes, this one %d", sandbox.MaxBatch, n)
	}
	maxOut, err := parseSize("--max-output", c.String("max-output"))
	if err != nil {
		return nil, err
	}
	var reqs []sandbox.Request
	for i, item := range in.Codes {
		lang, timeout := firstNonZero(item.Language, in.Language, "python"), in.Timeout
		if item.Timeout != 0 {
			timeout = item.Timeout
		}
		if timeout == 0 {
			timeout = c.Duration("timeout").Seconds()
		}
		if lang == "" {
			return nil, fmt.Errorf("code %d: no language: want python or shell", i)
		}
		if timeout <= 0 || timeout > maxTimeoutSecs {
			return nil, fmt.Errorf("code %d: timeout %g s: want more than 0 and at most %d", i, timeout, maxTimeoutSecs)
		}
		req := sandbox.Request{Language: lang, Code: item.Code, Timeout: time.Duration(timeout * float64(time.Second)), MaxOutput: maxOut}
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
