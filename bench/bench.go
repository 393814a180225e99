package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"github.com/flmbox/flmbox/sandbox"
)

// Options are what Run measures, how often, and with which binaries. Start
// from Defaults and change what you need: a zero count is not "the
// default" (Warmup 0 means no warm-up calls).
type Options struct {
	// Root is the state root beside which the bench works (the CLI's
	// --root): Run makes a private directory Root/bench-XXXX, created
	// with Root if need be, and removes it at the end. Required.
	Root string
	// Runsc is the runsc binary (the CLI's --runsc or FLMBOX_RUNSC).
	// Default: runsc on PATH (runtime.FindRunsc).
	Runsc string
	// Flmbox is the `flmbox` command run as whole processes, as users run
	// it (the front binary, not flmbox-core). The sandboxes Run makes in
	// process run the agent flmbox-agent from the same directory.
	// Required.
	Flmbox string
	// Image is the image to measure, as rootfs.ParseReference takes it
	// (CLI: --image). Empty: the only image of the image cache under Root,
	// by the reference or OCI layout it was prewarmed from (ErrNoImage if
	// there is not exactly one, or it was prewarmed by digest only).
	Image string
	// Pairs is the number of measured rounds of allocations (CLI:
	// --pairs; 1 to 10000): in each, a fresh sandbox by a whole process
	// and in process, a retained one, and raw runsc, in rotating order,
	// after one round that is not measured.
	Pairs int
	// Warmup is the number of warm calls of each method made before the
	// measured rounds, not measured (CLI: --warmup; 0 to 10000).
	Warmup int
	// Rounds of Calls measured warm calls per method and language (CLI:
	// --rounds and --calls; 1 to 10000 each).
	Rounds, Calls int
	// Pause is waited before each measured warm call, of every method
	// alike, and not measured (CLI: --pause; 0 to 1s). 0: calls back to
	// back. An agent's calls come with its model's think time between
	// them, which lets the next spare process be ready.
	Pause time.Duration
	// PrewarmRounds is the number of cold prewarms, and of crane export |
	// tar -x, from the loopback registry (1 to 10000; no flag). Cache-hit
	// prewarms: five times as many, at least 10.
	PrewarmRounds int
	// BatchSnippets is the size of the throughput batch, CPU-bound Python
	// snippets of about 0.2 s each (1 to sandbox.MaxBatch; no flag).
	BatchSnippets int
	// CallbackTrips is the number of measured callback round trips in each
	// run of the callback figure: Rounds calls in a sandbox and as many
	// host processes, each making 5 round trips that are not measured
	// first (1 to 1000; no flag).
	CallbackTrips int
	// EgressDownloads is the number of measured downloads of 100 MiB of
	// each side of the egress figures (1 to 100; no flag). Their connect
	// figure makes Rounds runs of EgressConnects measured TCP connects a
	// side (1 to 10000; no flag), each run after 5 that are not measured.
	EgressDownloads, EgressConnects int
	// Idle is how long a new sandbox, and the bare runsc container, idle
	// before their memory is measured (0 to 1 minute; no flag).
	Idle time.Duration
	// Density is the number of idle sandboxes of the density section
	// (CLI: --density; 0, the default: no density section; 1 to
	// 10000): made one after another, measured at every tenth of them,
	// with default spares, then with lazy spares (see Density).
	// DensitySuspended is the number of sandboxes of its suspended series,
	// each suspended right after its create (CLI: --density-suspended;
	// 0: Density). DensityOnly measures the density section alone (CLI:
	// --density-only), on the image as given, without the other sections
	// (their figures are left zero). Run refuses counts that the host's
	// limits would stop (ErrHostLimit) before it makes anything.
	Density, DensitySuspended int
	DensityOnly               bool
	// LongOnly measures the long calls alone (CLI: --long-only), on the
	// image as given, in a sandbox of flmbox's defaults: an image with
	// numpy gets the SVD figure too. The other sections' figures are left
	// zero.
	LongOnly bool
	// BigImage, if not 0, adds the big image's prewarm section: an image
	// of about this many bytes that the bench builds (CLI: --big-image
	// SIZE; see BigPrewarm).
	BigImage int64
	// Progress gets a line per stage ("bench:   12s  allocation: pair 2
	// of 12"). Default: none (the CLI passes its stderr, but none with
	// --json).
	Progress io.Writer
	// Warnf gets the warnings of the bench's sandbox.Manager (see
	// sandbox.WithWarnf): a sandbox of an in-process batch that could not
	// be removed, one an interrupted flmbox process left that the clean-up
	// removes. Default: none.
	Warnf func(format string, args ...any)
}

// Defaults returns the settings of the full protocol, which takes a few
// minutes on a 2-core machine: 12 pairs, 5 warm-up calls, 6 rounds of 50
// calls, 5 prewarm rounds, a batch of 64, 200 callback round trips per run,
// 5 egress downloads and 200 egress connects per run, 2 s of idling. With
// quick, every measurement is kept but repeated less, to finish within a
// minute: 3 pairs, 2 warm-up calls, 2 rounds of 10 calls, 2 prewarm
// rounds, a batch of 16, 50 callback round trips per run, 1 egress
// download and 50 egress connects per run, 1 s of idling (the CLI's
// --quick; flags set explicitly still win). Pause is 0; Root, Runsc,
// Flmbox, Image, Progress and Warnf are left empty.
func Defaults(quick bool) Options {
	if quick {
		return Options{Pairs: 3, Warmup: 2, Rounds: 2, Calls: 10, PrewarmRounds: 2, BatchSnippets: 16, CallbackTrips: 50,
			EgressDownloads: 1, EgressConnects: 50, Idle: time.Second}
	}
	return Options{Pairs: 12, Warmup: 5, Rounds: 6, Calls: 50, PrewarmRounds: 5, BatchSnippets: 64, CallbackTrips: 200,
		EgressDownloads: 5, EgressConnects: 200, Idle: 2 * time.Second}
}

// maxCount bounds every count of Options.
const maxCount = 10000

// validate reports what is wrong with o, if anything
// (errdefs.ErrInvalidArgument).
func (o Options) validate() error {
	if o.Root == "" {
		return fmt.Errorf("bench: no state root: %w", errdefs.ErrInvalidArgument)
	}
	if o.Flmbox == "" {
		return fmt.Errorf("bench: no flmbox binary to measure: %w", errdefs.ErrInvalidArgument)
	}
	if o.Pause < 0 || o.Pause > time.Second {
		return fmt.Errorf("bench: pause %s: want 0 to 1s: %w", o.Pause, errdefs.ErrInvalidArgument)
	}
	if o.Idle < 0 || o.Idle > time.Minute {
		return fmt.Errorf("bench: idle %s: want 0 to 1m: %w", o.Idle, errdefs.ErrInvalidArgument)
	}
	if o.Density < 0 || o.Density > maxDensity {
		return fmt.Errorf("bench: density %d: want 0 (none) to %d: %w", o.Density, maxDensity, errdefs.ErrInvalidArgument)
	}
	if o.DensitySuspended < 0 || o.DensitySuspended > maxDensity {
		return fmt.Errorf("bench: density suspended %d: want 0 to %d: %w", o.DensitySuspended, maxDensity, errdefs.ErrInvalidArgument)
	}
	if o.LongOnly && o.DensityOnly {
		return fmt.Errorf("bench: --long-only and --density-only each measure one section alone: %w", errdefs.ErrInvalidArgument)
	}
	if o.Density == 0 && (o.DensitySuspended > 0 || o.DensityOnly) {
		return fmt.Errorf("bench: no density count for the density section: %w", errdefs.ErrInvalidArgument)
	}
	for _, f := range []struct {
		name     string
		n        int
		min, max int
	}{
		{"pairs", o.Pairs, 1, maxCount}, {"warmup", o.Warmup, 0, maxCount}, {"rounds", o.Rounds, 1, maxCount},
		{"calls", o.Calls, 1, maxCount}, {"prewarm rounds", o.PrewarmRounds, 1, maxCount},
		{"batch snippets", o.BatchSnippets, 1, sandbox.MaxBatch}, {"callback round trips", o.CallbackTrips, 1, maxCallbackTrips},
		{"egress downloads", o.EgressDownloads, 1, maxDownloads}, {"egress connects", o.EgressConnects, 1, maxConnects},
	} {
		if f.n < f.min || f.n > f.max {
			return fmt.Errorf("bench: %s %d: want %d to %d: %w", f.name, f.n, f.min, f.max, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// ErrNotRoot is in the error of a bench run by another user than root: it
// runs sandboxes and chroot. It is errdefs.ErrPermissionDenied.
var ErrNotRoot = errkind.New(errdefs.ErrPermissionDenied, "the bench runs sandboxes and chroot, which need root: permission denied")

// ErrNoImage is in the error of a bench given no image when the image cache
// under Options.Root does not name exactly one image by its source. It is
// errdefs.ErrFailedPrecondition.
var ErrNoImage = errkind.New(errdefs.ErrFailedPrecondition, "no image to measure: failed precondition")

// checkDensity refuses a density section that the host's limits would
// stop before its count.
func (o Options) checkDensity() error {
	if o.Density == 0 {
		return nil
	}
	// The state root may not exist yet: its nearest existing parent
	// holds its disk.
	dir := o.Root
	for {
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			break
		}
		dir = filepath.Dir(dir)
	}
	l, err := readLimits(dir)
	if err != nil {
		return err
	}
	return l.check(o.Density, o.densitySuspended())
}

// Run measures this worker and returns the report. It works in a private
// state root under o.Root and removes it before it returns, also when ctx
// is cancelled: then the error says "bench interrupted" and wraps ctx's
// cause. Invalid options fail with errdefs.ErrInvalidArgument before
// anything is made; see also ErrNotRoot and ErrNoImage. Without python3 on
// the host's PATH (the callback and egress figures' baseline) or nsenter
// (which runs the egress figures in network namespaces of the bench's
// own), Run fails at once with errdefs.ErrFailedPrecondition.
func Run(ctx context.Context, o Options) (_ *Report, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := o.checkDensity(); err != nil {
		return nil, err
	}
	r, err := newRunner(ctx, o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if ctx.Err() != nil {
			err = fmt.Errorf("bench interrupted: %w", context.Cause(ctx))
		}
		err = errors.Join(err, r.close(context.WithoutCancel(ctx)))
	}()
	return r.run(ctx)
}
