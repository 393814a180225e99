package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/flmbox/flmbox/internal/warmcall"
	"github.com/flmbox/flmbox/snippet/wire"
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
func readBatch(c *cli.Context, path string) ([]*wire.Request, error) {
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
	var reqs []*wire.Request
	for i, item := range in.Codes {
		lang, timeout := firstNonZero(item.Language, in.Language, wire.LanguagePython), in.Timeout
		if item.Timeout != 0 {
			timeout = item.Timeout
		}
		if timeout == 0 {
			timeout = c.Duration("timeout").Seconds()
		}
		if timeout <= 0 || timeout > maxTimeoutSecs {
			return nil, fmt.Errorf("code %d: timeout %g s: want more than 0 and at most %d", i, timeout, maxTimeoutSecs)
		}
		req := &wire.Request{Version: wire.ProtocolVersion, Language: lang, Code: item.Code,
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
//
// With --image, each of the parallel workers makes a sandbox and runs its
// snippets there one after another, resetting the sandbox before each one
// but the first (wire.Request.Reset: other processes killed, /tmp and
// /dev/shm emptied), so that every snippet starts in a clean sandbox and
// none sees another's /tmp, for the price of one sandbox creation per
// worker. A worker whose sandbox failed makes a new one for its next
// snippet. With --sandbox, the snippets run side by side in that sandbox and
// share its /tmp, as its sequential calls do.
func runBatch(c *cli.Context, reqs []*wire.Request, parallel int) []batchResult {
	if parallel <= 0 {
		parallel = runtime.NumCPU()
	}
	parallel = min(parallel, len(reqs))
	out := make([]batchResult, len(reqs))
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range reqs {
			select {
			case next <- i:
			case <-c.Context.Done():
				return
			}
		}
	}()
	var g errgroup.Group
	for range parallel {
		g.Go(func() error {
			w := &batchWorker{c: c}
			defer w.close()
			for i := range next {
				out[i] = w.run(reqs[i])
			}
			return nil
		})
	}
	g.Wait()
	for i := range out {
		if out[i] == (batchResult{}) { // never started: interrupted
			out[i] = batchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: not run: %v", context.Cause(c.Context))}
		}
	}
	return out
}

// batchWorker runs batch snippets one at a time, in its own sandbox with
// --image.
type batchWorker struct {
	c  *cli.Context
	sb string // its sandbox (--image), once made
}

func (w *batchWorker) run(req *wire.Request) batchResult {
	start := time.Now()
	fail := func(err error) batchResult {
		return batchResult{ExitCode: -1, Stderr: fmt.Sprintf("flmbox: %v (after %s)", err, time.Since(start).Round(time.Millisecond))}
	}
	name := w.c.String("sandbox")
	if name == "" {
		if w.sb == "" {
			o, err := sandboxOptionsFrom(w.c)
			if err != nil {
				return fail(err)
			}
			sb, err := createSandbox(w.c.Context, w.c, o)
			if err != nil {
				return fail(err)
			}
			w.sb = sb.Name
		} else {
			req.Reset = true
		}
		name = w.sb
	}
	res, err := callSandbox(w.c.Context, w.c, name, req)
	if err == nil && res.Error != "" && req.Reset {
		err = errors.New(res.Error) // the reset failed: the sandbox is not clean
	}
	if err != nil {
		w.close() // a new sandbox for the next snippet
		return fail(err)
	}
	j := warmcall.ToJSON(res)
	if res.Error != "" {
		return batchResult{ExitCode: -1, Stdout: j.Stdout, Stderr: j.Stderr}
	}
	// An element has no timed_out field: its stderr says why it was killed.
	j.Stderr += warmcall.KillNote(res, time.Duration(req.TimeoutMS)*time.Millisecond)
	return batchResult{ExitCode: res.ExitCode, Stdout: j.Stdout, Stderr: j.Stderr}
}

// close removes the worker's sandbox, if it made one.
func (w *batchWorker) close() {
	if w.sb == "" {
		return
	}
	if err := removeSandbox(context.WithoutCancel(w.c.Context), w.c, w.sb); err != nil {
		warnf(w.c, "remove sandbox %s: %v", w.sb, err)
	}
	w.sb = ""
}

// printBatch writes the results as one JSON array, nothing else.
func printBatch(c *cli.Context, results []batchResult) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetEscapeHTML(false)
	return enc.Encode(results)
}
