package app

import (
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/sandbox"
)

// batchResult is an element of run --batch's output.
type batchResult = runcmd.BatchResult

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
		res, err := cliResult(r.Result, r.Err)
		out[i] = runcmd.BatchElement(c.Context, r.Ran, res, err, reqs[i].Timeout)
	}
	if err := runcmd.PrintBatch(c.App.Writer, out); err != nil {
		return err
	}
	if c.Context.Err() != nil { // Ctrl-C: what ran until then is printed
		return cli.Exit("", runcmd.InterruptStatus(c.Context))
	}
	return nil
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
	data, err := io.ReadAll(io.LimitReader(r, runcmd.MaxBatchInput+1))
	if err != nil {
		return nil, fmt.Errorf("read batch: %w", err)
	}
	in, err := runcmd.ParseBatch(data)
	if err != nil {
		return nil, err
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
		lang, timeout, err := in.Item(i, c.String("language"), c.Duration("timeout"))
		if err != nil {
			return nil, err
		}
		req := sandbox.Request{Language: lang, Code: item.Code, Timeout: timeout, MaxOutput: maxOut, Env: listFlag(c, "env"), Callback: cb}
		if err := req.Validate(); err != nil {
			return nil, fmt.Errorf("code %d: %w", i, err)
		}
		reqs = append(reqs, req)
	}
	return reqs, nil
}
