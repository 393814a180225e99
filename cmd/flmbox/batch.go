package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/internal/workers"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// A batch in a running sandbox: `flmbox run --batch FILE --sandbox NAME`.
//
// Its snippets are calls of the sandbox side by side, as warm calls are, so
// the flmbox command runs them itself as package sandbox's Batch does for
// an existing sandbox (at most --parallel at once, the number of CPUs by
// default; each snippet a call of its own, through sandbox/record), and
// prints the JSON array flmbox-core prints (runcmd's BatchElement). A
// batch it cannot read, a FILE that is not a regular file, a request
// flmbox-core would refuse, or a sandbox that does not take calls is
// handed to flmbox-core before anything runs.

// parseBatchCall recognizes `run --batch FILE --sandbox NAME` with only
// parseWarmCall's flags (but -c and --reset) and --parallel.
func parseBatchCall(args []string, lookupEnv func(string) (string, bool)) (*warmCall, bool) {
	w, ok := parseRun(args, lookupEnv, runBatchFlags)
	if !ok || w.batch == "" || w.batch == "-" || w.sandbox == "" || w.reset || w.hasCode || w.file != "" {
		return nil, false // flmbox-core's to run, or to refuse
	}
	return w, true
}

// withBatch adds --batch and --parallel to flags.
func withBatch(flags []runcmd.Flag) []runcmd.Flag {
	for _, f := range runcmd.RunFlags {
		if f.Name == "batch" || f.Name == "parallel" {
			flags = append(flags, f)
		}
	}
	return flags
}

// setParallel sets --parallel to value, a decimal number; false otherwise
// (flmbox-core reads other forms).
func (w *warmCall) setParallel(value string) bool {
	n, err := strconv.Atoi(value)
	if err != nil || strconv.Itoa(n) != value {
		return false
	}
	w.parallel = n
	return true
}

// runBatch runs the batch and prints its results; handled is false when
// nothing ran and flmbox-core must run the command line.
func (w *warmCall) runBatch(ctx context.Context, stdout, stderr io.Writer) (code int, handled bool) {
	data, ok := readRegularFile(w.batch)
	if !ok {
		return 0, false
	}
	in, err := runcmd.ParseBatch([]byte(data))
	if err != nil {
		return 0, false
	}
	reqs := make([]*wire.Request, len(in.Codes))
	timeouts := make([]time.Duration, len(in.Codes))
	for i, item := range in.Codes {
		lang, timeout, err := in.Item(i, w.language, w.timeout)
		if err != nil {
			return 0, false
		}
		reqs[i] = &wire.Request{Version: wire.ProtocolVersion, Language: lang, Code: item.Code,
			TimeoutMS: timeout.Milliseconds(), MaxOutput: w.maxOutput, Env: w.env}
		timeouts[i] = timeout
		if reqs[i].Validate() != nil {
			return 0, false
		}
	}
	if rec, err := record.Read(w.root, w.sandbox); err != nil || rec.Callable() != nil {
		return 0, false
	}
	type outcome struct {
		ran bool
		res *wire.Result
		err error
	}
	outcomes := make([]outcome, len(reqs))
	workers.Run(ctx, len(reqs), w.parallel, func(next <-chan int) {
		for i := range next {
			res, err := w.callOne(ctx, reqs[i])
			outcomes[i] = outcome{true, res, err}
		}
	})
	out := make([]runcmd.BatchResult, len(reqs))
	for i, o := range outcomes {
		out[i] = runcmd.BatchElement(ctx, o.ran, runcmd.FromWire(o.res), o.err, timeouts[i])
	}
	if err := runcmd.PrintBatch(stdout, out); err != nil {
		fmt.Fprintf(stderr, "flmbox: %s\n", err)
		return runcmd.ExitFlmboxFailed, true
	}
	if ctx.Err() != nil { // Ctrl-C: what ran until then is printed
		return runcmd.InterruptStatus(ctx), true
	}
	return 0, true
}

// callOne makes one call of the batch, reading the sandbox's record again
// as each of package sandbox's calls does; an interrupted call keeps what
// its snippet printed.
func (w *warmCall) callOne(ctx context.Context, req *wire.Request) (*wire.Result, error) {
	rec, err := record.Read(w.root, w.sandbox)
	if err == nil {
		err = rec.Callable()
	}
	if err != nil {
		return nil, err
	}
	res, err := rec.Call(ctx, req)
	if errors.Is(err, wire.ErrInterrupted) && res != nil && res.Interrupted {
		return res, nil
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}
