package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/flmbox/flmbox/snippet"
)

// Bounds of a batch.
const (
	maxBatch       = 64
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

// readBatch parses and validates a batch; nothing runs if any of it is bad.
func readBatch(c *cli.Context, path string) ([]*snippet.Request, error) {
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
	if n := len(in.Codes); n == 0 || n > maxBatch {
		return nil, fmt.Errorf("a batch holds 1 to %d codes, this one %d", maxBatch, n)
	}
	maxOut, err := parseSize("--max-output", c.String("max-output"))
	if err != nil {
		return nil, err
	}
	var reqs []*snippet.Request
	for i, item := range in.Codes {
		lang, timeout := firstNonZero(item.Language, in.Language, snippet.LanguagePython), in.Timeout
		if item.Timeout != 0 {
			timeout = item.Timeout
		}
		if timeout == 0 {
			timeout = c.Duration("timeout").Seconds()
		}
		if timeout <= 0 || timeout > maxTimeoutSecs {
			return nil, fmt.Errorf("code %d: timeout %g s: want more than 0 and at most %d", i, timeout, maxTimeoutSecs)
		}
		req := &snippet.Request{Version: snippet.ProtocolVersion, Language: lang, Code: item.Code,
			TimeoutMS: int64(timeout * 1000), MaxOutput: maxOut}
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

// runBatch runs the requests, at most parallel at once, and returns their
// results in input order. A snippet flmbox fails to run gets exit_code -1 and
// the error in stderr; the others still run.
func runBatch(c *cli.Context, reqs []*snippet.Request, parallel int) []batchResult {
	if parallel <= 0 {
		parallel = runtime.NumCPU()
	}
	out := make([]batchResult, len(reqs))
	var g errgroup.Group
	g.SetLimit(parallel)
	for i, req := range reqs {
		g.Go(func() error {
			out[i] = runOne(c, req)
			return nil
		})
	}
	g.Wait()
	return out
}

func runOne(c *cli.Context, req *snippet.Request) batchResult {
	start := time.Now()
	res, cleanup, err := runSnippet(c, req)
	if err == nil {
		cleanup()
	}
	if err != nil {
		return batchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: %v (after %s)", err, time.Since(start).Round(time.Millisecond))}
	}
	j := toJSON(res)
	code := res.ExitCode
	if res.Error != "" {
		code = -1
	}
	return batchResult{ExitCode: code, Stdout: j.Stdout, Stderr: j.Stderr}
}

// printBatch writes the results as one JSON array, nothing else.
func printBatch(c *cli.Context, results []batchResult) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetEscapeHTML(false)
	return enc.Encode(results)
}
