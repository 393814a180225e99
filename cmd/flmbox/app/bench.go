package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
)

// benchOptions is what `flmbox bench` measures and how often. The zero value
// is not useful: benchOptionsFrom fills every field.
type benchOptions struct {
	// image is IMAGE as prewarm takes it; empty: the cache's only image.
	image string
	// pairs of allocations: a fresh sandbox, a retained one, raw runsc.
	pairs int
	// warmup calls of each kind, not measured, before the warm rounds.
	warmup int
	// rounds of calls warm calls per kind.
	rounds, calls int
	// pause before each warm call (not measured): 0 makes calls back to
	// back; an agent's calls come with its model's think time between them.
	pause time.Duration
	// prewarmRounds of a cold prewarm and a crane export | tar.
	prewarmRounds int
	// batchSnippets is the size of the throughput batch (64; fewer with --quick).
	batchSnippets int
	// idle is how long a sandbox idles before its memory is measured.
	idle time.Duration
	// json prints one JSON object instead of the table.
	json bool
}

// benchPreset is a set of defaults: the full protocol, or --quick's.
type benchPreset struct {
	pairs, warmup, rounds, calls, prewarmRounds, batchSnippets int
	idle                                                       time.Duration
}

// The full run follows issue 4's protocol and takes a few minutes on a
// 2-core machine; --quick keeps every measurement but repeats each less, to
// finish within a minute.
var (
	benchFull  = benchPreset{pairs: 12, warmup: 5, rounds: 6, calls: 50, prewarmRounds: 5, batchSnippets: 64, idle: 2 * time.Second}
	benchQuick = benchPreset{pairs: 3, warmup: 2, rounds: 2, calls: 10, prewarmRounds: 2, batchSnippets: 16, idle: time.Second}
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure this worker: sandbox allocation, warm calls, batch throughput, prewarm, memory, each beside its baseline",
		Description: `Every figure comes with a baseline measured in the same run (raw runsc, runsc exec, the same
command under chroot, crane export | tar) and the reference system's number where there is one.

The bench works in a private state root, a directory bench-XXXX under --root that it removes at the
end (also when interrupted): it never touches the sandboxes or the image cache of --root. IMAGE is
copied into an in-process registry on 127.0.0.1 and prewarmed from there. Without --image, the
image cache of --root must hold exactly one image whose source it knows (a tag or an OCI layout).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "image", Usage: "image to measure, as prewarm takes it (default: the cache's only image)"},
			&cli.IntFlag{Name: "pairs", Value: benchFull.pairs, Usage: "allocation pairs (fresh sandbox, raw runsc)"},
			&cli.IntFlag{Name: "warmup", Value: benchFull.warmup, Usage: "warm calls of each kind not measured"},
			&cli.IntFlag{Name: "rounds", Value: benchFull.rounds, Usage: "rounds of measured warm calls"},
			&cli.IntFlag{Name: "calls", Value: benchFull.calls, Usage: "measured warm calls per round"},
			&cli.DurationFlag{Name: "pause", Usage: "pause before each warm call, for every method alike (default: back to back)"},
			&cli.BoolFlag{Name: "quick", Usage: "fewer pairs, rounds and calls (under a minute); explicit flags still win"},
			jsonFlag,
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("bench takes no arguments, got %q; name the image with --image", c.Args().Slice())
			}
			o, err := benchOptionsFrom(c)
			if err != nil {
				return err
			}
			rep, err := runBench(c, o)
			if err != nil {
				return err
			}
			return printBench(c.App.Writer, rep, o.json)
		},
	}
}

// runBench measures in a private state root and removes it afterwards, also
// when the bench is interrupted.
func runBench(c *cli.Context, o benchOptions) (_ *benchReport, err error) {
	b, err := newBench(c, o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if c.Context.Err() != nil {
			err = fmt.Errorf("bench interrupted: %w", context.Cause(c.Context))
		}
		err = errors.Join(err, b.close(context.WithoutCancel(c.Context)))
	}()
	return b.run(c.Context)
}

// benchOptionsFrom reads bench's flags: --quick picks the quick preset, and
// flags set explicitly override it.
func benchOptionsFrom(c *cli.Context) (benchOptions, error) {
	p := benchFull
	if c.Bool("quick") {
		p = benchQuick
	}
	o := benchOptions{image: c.String("image"), pairs: p.pairs, warmup: p.warmup, rounds: p.rounds, calls: p.calls,
		prewarmRounds: p.prewarmRounds, batchSnippets: p.batchSnippets, idle: p.idle, json: c.Bool("json"), pause: c.Duration("pause")}
	if o.pause < 0 || o.pause > time.Second {
		return o, fmt.Errorf("--pause %s: want 0 to 1s", o.pause)
	}
	for _, f := range []struct {
		name string
		dst  *int
		min  int
	}{{"pairs", &o.pairs, 1}, {"warmup", &o.warmup, 0}, {"rounds", &o.rounds, 1}, {"calls", &o.calls, 1}} {
		if c.IsSet(f.name) {
			*f.dst = c.Int(f.name)
		}
		if *f.dst < f.min || *f.dst > 10000 {
			return o, fmt.Errorf("--%s %d: want %d to 10000", f.name, *f.dst, f.min)
		}
	}
	return o, nil
}
