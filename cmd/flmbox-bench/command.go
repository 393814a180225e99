package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/bench"
	"github.com/flmbox/flmbox/cmd/flmbox/app"
)

func benchCommand() *cli.Command {
	full := bench.Defaults(false)
	return &cli.Command{
		Name:  "bench",
		Usage: app.BenchUsage,
		Description: `Every figure comes with a baseline measured in the same run (raw runsc, runsc exec, the same
command under chroot, crane export | tar, the same callback client, download and connects on the host) and the reference
system's number where there is one.

The bench works in a private state root, a directory bench-XXXX under --root that it removes at the
end (also when interrupted): it never touches the sandboxes or the image cache of --root. IMAGE is
copied into an in-process registry on 127.0.0.1 and prewarmed from there. Without --image, the
image cache of --root must hold exactly one image whose source it knows (a tag or an OCI layout).

The egress figures (--network egress) run in two network namespaces the bench makes and removes,
flmbox-ID-world (its own "internet", a server on 198.51.100.10) and flmbox-ID-worker (joined to it
by a veth): nothing is sent off the machine, and the host's own namespace is left as it is.

--density N adds a section (last, or alone with --density-only): N idle sandboxes made one after
another with flmbox's defaults, measured at the first and at every tenth of N (host memory per
sandbox, creates, calls to random ones, listing, idle CPU, host tasks and file descriptors), then
the same with lazy spares, then --density-suspended sandboxes each suspended after its create (disk,
suspend, resume of a random one by its call). Each series ends with a call to every sandbox, then
removes them. The bench refuses a count that the host's free memory, kernel.pid_max,
kernel.threads-max, fs.file-max or free disk would stop.

--long-only measures only the long calls, on the image as given: code that runs for seconds (a
pure-Python loop; with numpy in the image, an SVD), timed by itself as a flmbox call, by runsc exec
in the same sandbox and in bare runsc of flmbox's spec.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "image", Usage: "image to measure, as prewarm takes it (default: the cache's only image)"},
			&cli.IntFlag{Name: "pairs", Value: full.Pairs, Usage: "allocation pairs (fresh sandbox, raw runsc)"},
			&cli.IntFlag{Name: "warmup", Value: full.Warmup, Usage: "warm calls of each kind not measured"},
			&cli.IntFlag{Name: "rounds", Value: full.Rounds, Usage: "rounds of measured warm calls"},
			&cli.IntFlag{Name: "calls", Value: full.Calls, Usage: "measured warm calls per round"},
			&cli.IntFlag{Name: "prewarm-rounds", Value: full.PrewarmRounds, Usage: "cold prewarms, each beside a crane export | tar -x"},
			&cli.StringFlag{Name: "big-image", Usage: "add a section: an image of `SIZE` (1GiB, say) that the bench builds, prewarmed cold beside crane export | tar -x (up to 3 rounds)"},
			app.DurationOrZeroFlag("pause", 0, "pause before each warm call, for every method alike (default: back to back)"),
			&cli.IntFlag{Name: "density", DefaultText: "none, nor with --quick",
				Usage: "add the density section: `N` idle sandboxes made one after another, with default spares, then lazy spares"},
			&cli.IntFlag{Name: "density-suspended", DefaultText: "N",
				Usage: "`M` sandboxes in the density section's suspended series, each suspended after its create"},
			&cli.BoolFlag{Name: "density-only", Usage: "measure only the density section"},
			&cli.BoolFlag{Name: "long-only", Usage: "measure only the long calls (a pure-Python loop; with numpy in the image, an SVD), on the image as given"},
			&cli.BoolFlag{Name: "quick", Usage: "fewer pairs, rounds and calls (under a minute); explicit flags still win"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("bench takes no arguments, got %q; name the image with --image", c.Args().Slice())
			}
			o, err := benchOptionsFrom(c)
			if err != nil {
				return err
			}
			rep, err := bench.Run(c.Context, o)
			switch {
			case errors.Is(err, bench.ErrNotRoot):
				return app.Advise(err, "run it as root")
			case errors.Is(err, bench.ErrHostLimit):
				return app.Advise(err, "lower --density (or --density-suspended), or raise that limit")
			case errors.Is(err, bench.ErrNoImage):
				return app.Advise(err, "name the image to measure with --image IMAGE (flmbox images ls lists them)")
			case errors.Is(err, fs.ErrNotExist) && missing(o.Flmbox):
				return app.Advise(err, "install flmbox, flmbox-core, flmbox-bench and flmbox-agent in one directory (make build puts them in bin/)")
			case err != nil:
				return err
			}
			if c.Bool("json") {
				return rep.WriteJSON(c.App.Writer)
			}
			return rep.WriteTable(c.App.Writer)
		},
	}
}

// benchOptionsFrom reads bench's flags: --quick picks the quick preset, and
// flags set explicitly override it. bench.Run checks the values.
func benchOptionsFrom(c *cli.Context) (bench.Options, error) {
	o := bench.Defaults(c.Bool("quick"))
	for _, f := range []struct {
		name string
		dst  *int
	}{{"pairs", &o.Pairs}, {"warmup", &o.Warmup}, {"rounds", &o.Rounds}, {"calls", &o.Calls}, {"prewarm-rounds", &o.PrewarmRounds}} {
		if c.IsSet(f.name) {
			*f.dst = c.Int(f.name)
		}
	}
	o.Image, o.Pause, o.Root, o.Runsc = c.String("image"), c.Duration("pause"), c.String("root"), c.String("runsc")
	o.Density, o.DensitySuspended, o.DensityOnly = c.Int("density"), c.Int("density-suspended"), c.Bool("density-only")
	o.LongOnly = c.Bool("long-only")
	if s := c.String("big-image"); s != "" {
		n, err := units.RAMInBytes(s)
		if err != nil || n <= 0 {
			return o, fmt.Errorf("--big-image %q: want a size, as 1GiB: %w", s, errdefs.ErrInvalidArgument)
		}
		o.BigImage = n
	}
	self, err := os.Executable()
	if err != nil {
		return o, fmt.Errorf("find the flmbox binary to measure: %w", err)
	}
	// The flmbox command that users run, next to this flmbox-bench;
	// bench.Run says if it is missing.
	o.Flmbox = filepath.Join(filepath.Dir(self), "flmbox")
	if !c.Bool("json") {
		o.Progress = c.App.ErrWriter
	}
	o.Warnf = func(format string, args ...any) { app.Warnf(c, format, args...) }
	return o, nil
}

// missing reports whether there is nothing at path.
func missing(path string) bool {
	_, err := os.Stat(path)
	return errors.Is(err, fs.ErrNotExist)
}
