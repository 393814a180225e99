package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

// wantOutput is what every measured call must print.
const wantOutput = "agent-perf-ok\n"

// snippet is the code of a measured call, for every way of running it.
type snippet struct {
	language string   // of a sandbox.Request
	code     string   // of a sandbox.Request
	argv     []string // for runsc exec and chroot: what the agent runs
}

var (
	pythonSnippet = snippet{sandbox.Python, "print('agent-perf-ok')", []string{"python3", "-c", "print('agent-perf-ok')"}}
	shellSnippet  = snippet{sandbox.Shell, "echo agent-perf-ok", []string{"/bin/sh", "-c", "echo agent-perf-ok"}}
)

// request is s as the CLI sends it: a 30 s timeout, the default output cap.
func (s snippet) request() sandbox.Request {
	return sandbox.Request{Language: s.language, Code: s.code, Timeout: sandbox.DefaultTimeout, MaxOutput: sandbox.DefaultMaxOutput}
}

// allocator gets a new sandbox's first result and returns how long that took.
type allocator func(ctx context.Context) (time.Duration, error)

// leaveForReset is a call, before each retained allocation and not timed,
// that leaves a file in /tmp and a process that left its group, for the
// reset to clear.
const leaveForReset = "import subprocess\nopen('/tmp/left', 'w').write('x')\nsubprocess.Popen(['sleep', '1000'], start_new_session=True)\nprint('agent-perf-ok')"

// retainedAllocator returns how to allocate a retained sandbox: a new
// logical sandbox (clean /tmp, no processes left over) on an already running
// gVisor sandbox, timed until its first result: a whole
// `flmbox run --sandbox NAME --reset` process. Before each, untimed, a call
// leaves something for the reset to clear. The sandbox is made at the first
// use and removed with the bench's root.
func (r *runner) retainedAllocator() allocator {
	var sb *sandbox.Sandbox
	return func(ctx context.Context) (time.Duration, error) {
		if sb == nil {
			var err error
			if sb, err = r.m.Create(ctx, r.spec("bench-retained")); err != nil {
				return 0, err
			}
		}
		req := pythonSnippet.request()
		req.Code = leaveForReset
		res, err := sb.Call(ctx, req)
		if err != nil {
			return 0, fmt.Errorf("leave something for the reset: %w", err)
		}
		if err := checkResult("the call that leaves something for the reset", res); err != nil {
			return 0, err
		}
		return timeToOutput(r.flmbox(ctx, "run", "--sandbox", sb.Name, "--reset", "-c", pythonSnippet.code), wantOutput)
	}
}

// measureAllocation runs Pairs rounds of every allocator, rotating which
// goes first, after one round that is not measured (it pays for cold caches).
func (r *runner) measureAllocation(ctx context.Context) (Allocation, error) {
	var rep Allocation
	if err := r.writeRawBundle(); err != nil {
		return rep, err
	}
	if err := r.fillPool(ctx); err != nil {
		return rep, err
	}
	defer r.drainPool(context.WithoutCancel(ctx)) // not to share pages with later measurements
	var release []float64
	kinds := []struct {
		name  string
		alloc allocator
		ms    []float64
	}{
		{name: "flmbox run --image", alloc: r.freshCLI},
		{name: "in process", alloc: r.freshInprocess},
		{name: "retained", alloc: r.retainedAllocator()},
		{name: "raw runsc", alloc: r.rawAllocation},
		{name: "flmbox run --image, warm pool", alloc: r.pooledAllocator(&release)},
	}
	for i := -1; i < r.opts.Pairs; i++ {
		if i >= 0 {
			r.logf("allocation: pair %d of %d", i+1, r.opts.Pairs)
		}
		for j := range kinds {
			k := &kinds[(max(i, 0)+j)%len(kinds)]
			d, err := k.alloc(ctx)
			if err != nil {
				return rep, fmt.Errorf("allocation (%s): %w", k.name, err)
			}
			if i >= 0 {
				k.ms = append(k.ms, ms(d))
			}
		}
	}
	retained, pooled, released := summarize(kinds[2].ms), summarize(kinds[4].ms), summarize(release[len(release)-len(kinds[4].ms):])
	rep.FreshMS, rep.FreshInprocessMS, rep.RetainedMS, rep.RawRunscMS = summarize(kinds[0].ms), summarize(kinds[1].ms), &retained, summarize(kinds[3].ms)
	rep.PooledMS, rep.PooledReleaseMS = &pooled, &released
	return rep, nil
}

// freshCLI times a whole `flmbox run --image` process until the snippet's
// output is back on its stdout; what the process does after printing
// (removing its sandbox) is not timed.
func (r *runner) freshCLI(ctx context.Context) (time.Duration, error) {
	return timeToOutput(r.flmbox(ctx, "run", "--image", r.ref, "-c", pythonSnippet.code), wantOutput)
}

// freshInprocess times the same through the Go API in this process:
// Manager.Create, then Manager.Call. Removal is not timed.
func (r *runner) freshInprocess(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	sb, err := r.m.Create(ctx, r.spec(""))
	if err != nil {
		return 0, err
	}
	defer sb.Remove(context.WithoutCancel(ctx))
	if _, err := r.call(ctx, sb.Name, pythonSnippet); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// call times one call through the Go API (Manager.Call, with the request
// the CLI sends) and checks its result.
func (r *runner) call(ctx context.Context, name string, s snippet) (time.Duration, error) {
	start := time.Now()
	res, err := r.m.Call(ctx, name, s.request())
	d := time.Since(start)
	if err != nil {
		return d, err
	}
	return d, checkResult("Manager.Call", res)
}

// checkResult fails unless a call exited 0, wrote nothing to stderr and
// printed exactly wantOutput.
func checkResult(what string, res *sandbox.Result) error {
	if stderr := string(res.Stderr.Data); res.ExitCode != 0 || stderr != "" {
		return fmt.Errorf("check the result of %s: exit %d, stderr %q", what, res.ExitCode, stderr)
	}
	return checkOutput(what, string(res.Stdout.Data), wantOutput)
}
