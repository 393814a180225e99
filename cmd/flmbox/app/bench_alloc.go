package app

import (
	"context"
	"fmt"
	"time"

	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/snippet/wire"
)

// benchWant is what every measured call must print.
const benchWant = "agent-perf-ok\n"

// benchSnippet is the code of a measured call, for every way of running it.
type benchSnippet struct {
	language string   // of a wire.Request
	code     string   // of a wire.Request
	argv     []string // for runsc exec and chroot: what the agent runs
}

var (
	pythonSnippet = benchSnippet{wire.LanguagePython, "print('agent-perf-ok')", []string{"python3", "-c", "print('agent-perf-ok')"}}
	shellSnippet  = benchSnippet{wire.LanguageShell, "echo agent-perf-ok", []string{"/bin/sh", "-c", "echo agent-perf-ok"}}
)

// request is s as the CLI sends it: a 30 s timeout, the default output cap.
func (s benchSnippet) request() *wire.Request {
	return &wire.Request{Version: wire.ProtocolVersion, Language: s.language, Code: s.code,
		TimeoutMS: (30 * time.Second).Milliseconds(), MaxOutput: wire.DefaultMaxOutput}
}

// allocator gets a new sandbox's first result and returns how long that took.
type allocator func(ctx context.Context) (time.Duration, error)

// retainedAllocator returns how to allocate a retained sandbox: a new
// logical sandbox (clean /tmp, no processes left over) on an already running
// gVisor sandbox, timed until its first result: a whole
// `flmbox run --sandbox NAME --reset` process. Before each, untimed, a call
// leaves a file in /tmp and a process that left its group, for the reset to
// clear. The sandbox is made at the first use and removed with the bench's
// root.
func (b *bench) retainedAllocator() allocator {
	var sb *runtime.Sandbox
	return func(ctx context.Context) (time.Duration, error) {
		if sb == nil {
			o, err := b.sandboxOptions("bench-retained")
			if err != nil {
				return 0, err
			}
			if sb, err = createSandbox(ctx, b.cli, o); err != nil {
				return 0, err
			}
		}
		req := pythonSnippet.request()
		req.Code = "import subprocess\nopen('/tmp/left', 'w').write('x')\nsubprocess.Popen(['sleep', '1000'], start_new_session=True)\nprint('agent-perf-ok')"
		req.Limits = snippetLimits(sb.Limits)
		if res, err := wire.Call(ctx, agentSocketPath(sb), req); err != nil || res.ExitCode != 0 {
			return 0, fmt.Errorf("leave something for the reset: %v %v", err, res)
		}
		return timeToOutput(b.flmbox(ctx, "run", "--sandbox", sb.Name, "--reset", "-c", pythonSnippet.code), benchWant)
	}
}

// measureAllocation runs --pairs rounds of every allocator, rotating which
// goes first, after one round that is not measured (it pays for cold caches).
func (b *bench) measureAllocation(ctx context.Context) (allocationReport, error) {
	var rep allocationReport
	if err := b.writeRawBundle(); err != nil {
		return rep, err
	}
	kinds := []struct {
		name  string
		alloc allocator
		ms    []float64
	}{
		{name: "flmbox run --image", alloc: b.freshCLI},
		{name: "in process", alloc: b.freshInprocess},
		{name: "retained", alloc: b.retainedAllocator()},
		{name: "raw runsc", alloc: b.rawAllocation},
	}
	for i := -1; i < b.opts.pairs; i++ {
		if i >= 0 {
			b.logf("allocation: pair %d of %d", i+1, b.opts.pairs)
		}
		for j := range kinds {
			k := &kinds[(max(i, 0)+j)%len(kinds)]
			if k.alloc == nil {
				continue
			}
			d, err := k.alloc(ctx)
			if err != nil {
				return rep, fmt.Errorf("allocation (%s): %w", k.name, err)
			}
			if i >= 0 {
				k.ms = append(k.ms, ms(d))
			}
		}
	}
	rep.FreshMS, rep.FreshInprocessMS, rep.RawRunscMS = summarize(kinds[0].ms), summarize(kinds[1].ms), summarize(kinds[3].ms)
	if kinds[2].alloc != nil {
		s := summarize(kinds[2].ms)
		rep.RetainedMS = &s
	}
	return rep, nil
}

// freshCLI times a whole `flmbox run --image` process until the snippet's
// output is back on its stdout; what the process does after printing
// (removing its sandbox) is not timed.
func (b *bench) freshCLI(ctx context.Context) (time.Duration, error) {
	return timeToOutput(b.flmbox(ctx, "run", "--image", b.ref, "-c", pythonSnippet.code), benchWant)
}

// freshInprocess times the same through the CLI's own functions in this
// process: create a sandbox, call its agent. Removal is not timed.
func (b *bench) freshInprocess(ctx context.Context) (time.Duration, error) {
	o, err := b.sandboxOptions("")
	if err != nil {
		return 0, err
	}
	start := time.Now()
	sb, err := createSandbox(ctx, b.cli, o)
	if err != nil {
		return 0, err
	}
	defer removeSandbox(context.WithoutCancel(ctx), b.cli, sb.Name)
	if _, err := callAgent(ctx, sb, pythonSnippet); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// sandboxOptions are flmbox's defaults for a sandbox on the bench's image.
func (b *bench) sandboxOptions(name string) (sandboxOptions, error) {
	o, err := sandboxOptionsFrom(b.cli)
	o.name, o.image = name, b.ref
	return o, err
}

// callAgent times one call through the Go API (wire.Call on the agent's
// socket, with the limits the CLI gives a call) and checks its result.
func callAgent(ctx context.Context, sb *runtime.Sandbox, s benchSnippet) (time.Duration, error) {
	req := s.request()
	req.Limits = snippetLimits(sb.Limits)
	start := time.Now()
	res, err := wire.Call(ctx, agentSocketPath(sb), req)
	d := time.Since(start)
	if err != nil {
		return d, err
	}
	return d, checkResult("wire.Call", res.ExitCode, string(res.Stdout.Data), string(res.Stderr.Data)+res.Error)
}

// checkResult fails unless a call exited 0 and printed exactly benchWant.
func checkResult(what string, code int, stdout, stderr string) error {
	if code != 0 || stderr != "" {
		return fmt.Errorf("check the result of %s: exit %d, stderr %q", what, code, stderr)
	}
	return checkOutput(what, stdout, benchWant)
}
