package bench

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/flmbox/flmbox/sandbox"
	"golang.org/x/sys/unix"
)

// warmMethod is one way of making a warm call, and its measured rounds.
type warmMethod struct {
	name   string
	call   func(ctx context.Context) (time.Duration, error)
	rounds [][]float64
}

// measureWarm measures warm calls on the persistent sandbox sb, for each
// language: through `flmbox run --sandbox` and `flmbox run --batch
// --sandbox` (a batch of one) as whole processes, and through
// Manager.Call and Manager.Batch in this process, against runsc exec of
// the same command in sb and the same command under chroot.
func (r *runner) measureWarm(ctx context.Context, sb *sandbox.Sandbox) ([]Warm, error) {
	var out []Warm
	for _, s := range []snippet{pythonSnippet, shellSnippet} {
		batchFile := filepath.Join(r.dir, "warm-batch-"+s.language+".json")
		if err := writeBatch(batchFile, s.language, 0, s.code); err != nil {
			return nil, err
		}
		methods := []*warmMethod{
			{name: "flmbox run --sandbox", call: func(ctx context.Context) (time.Duration, error) {
				return checkedCommand(r.flmbox(ctx, "run", "--sandbox", sb.Name, "--language", s.language, "-c", s.code))
			}},
			{name: "Manager.Call", call: func(ctx context.Context) (time.Duration, error) { return r.call(ctx, sb.Name, s) }},
			{name: "flmbox run --batch --sandbox", call: func(ctx context.Context) (time.Duration, error) {
				return batchCall(r.flmbox(ctx, "run", "--batch", batchFile, "--sandbox", sb.Name))
			}},
			{name: "Manager.Batch", call: func(ctx context.Context) (time.Duration, error) {
				start := time.Now()
				res, err := r.m.Batch(ctx, sandbox.Target{Sandbox: sb.Name}, []sandbox.Request{s.request()}, 0)
				d := time.Since(start)
				if err != nil {
					return d, err
				}
				return d, checkBatchResult("Manager.Batch", res)
			}},
			{name: "runsc exec", call: func(ctx context.Context) (time.Duration, error) {
				return r.timeRunscExec(ctx, sb, s.argv)
			}},
			{name: "chroot", call: func(ctx context.Context) (time.Duration, error) {
				return checkedCommand(r.native(ctx, s.argv))
			}},
		}
		r.logf("warm calls: %s", s.language)
		if err := r.runWarm(ctx, methods); err != nil {
			return nil, err
		}
		rx, rp := roundSummary(methods[4].rounds)
		nx, np := roundSummary(methods[5].rounds)
		for i, api := range []string{"sandbox", "batch"} {
			cli, inproc := methods[2*i], methods[2*i+1]
			w := Warm{API: api, Language: s.language, RunscExecMedianMS: rx, RunscExecP95MS: rp,
				NativeMedianMS: nx, NativeP95MS: np, Calls: r.opts.Rounds * r.opts.Calls}
			w.MedianMS, w.P95MS = roundSummary(cli.rounds)
			w.InprocessMedianMS, w.InprocessP95MS = roundSummary(inproc.rounds)
			out = append(out, w)
		}
	}
	return out, nil
}

// runWarm makes Warmup calls of each method, then Rounds rounds of Calls
// calls of each, rotating which method goes first; Pause before each
// measured call.
func (r *runner) runWarm(ctx context.Context, methods []*warmMethod) error {
	for _, m := range methods {
		for range r.opts.Warmup {
			if _, err := m.call(ctx); err != nil {
				return fmt.Errorf("warm-up call (%s): %w", m.name, err)
			}
		}
	}
	for round := range r.opts.Rounds {
		for j := range methods {
			m := methods[(round+j)%len(methods)]
			xs := make([]float64, 0, r.opts.Calls)
			for range r.opts.Calls {
				if r.opts.Pause > 0 {
					select {
					case <-time.After(r.opts.Pause):
					case <-ctx.Done():
					}
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				d, err := m.call(ctx)
				if err != nil {
					return fmt.Errorf("warm call (%s): %w", m.name, err)
				}
				xs = append(xs, ms(d))
			}
			m.rounds = append(m.rounds, xs)
		}
	}
	return nil
}

// batchCall times a `flmbox run --batch` process of one snippet and checks
// its result.
func batchCall(cmd *exec.Cmd) (time.Duration, error) {
	d, out, err := timeCommand(cmd)
	if err != nil {
		return d, err
	}
	res, err := readBatchOutput(cmd, out, 1)
	if err != nil {
		return d, err
	}
	x := res[0]
	if x.ExitCode != 0 || x.Stderr != "" {
		return d, fmt.Errorf("check the result of %s: exit %d, stderr %q", commandLine(cmd), x.ExitCode, x.Stderr)
	}
	return d, checkOutput(commandLine(cmd), x.Stdout, wantOutput)
}

// checkBatchResult fails unless a batch of one ran and printed exactly
// wantOutput.
func checkBatchResult(what string, res []sandbox.BatchResult) error {
	if len(res) != 1 {
		return fmt.Errorf("check the result of %s: %d results, want 1", what, len(res))
	}
	switch x := res[0]; {
	case x.Err != nil:
		return fmt.Errorf("%s: %w", what, x.Err)
	case !x.Ran || x.Result == nil:
		return fmt.Errorf("check the result of %s: the snippet did not run", what)
	default:
		return checkResult(what, x.Result)
	}
}

// strayKills is how many times timeRunscExec runs a runsc exec again that
// the sandbox's agent killed.
const strayKills = 2

// timeRunscExec times runsc exec of argv in sb as checkedExec does, with
// the sandbox's own runsc root and global flags, as its snippets' user
// (the sandbox's first process, the agent, is root). The process runsc
// exec starts is none of the agent's: once a call has ended, the agent
// kills every process of its sandbox that is not its own (snippet's
// strays, so that nothing a call left runs between calls), so one that
// starts while the agent sweeps after the flmbox call measured before it
// is killed (exit 137, SIGKILL): it is run again, its time not counted.
func (r *runner) timeRunscExec(ctx context.Context, sb *sandbox.Sandbox, argv []string) (time.Duration, error) {
	rc, err := r.sandboxRunc(sb)
	if err != nil {
		return 0, err
	}
	for try := 0; ; try++ {
		d, code, err := r.checkedExec(ctx, rc, sb.ID, argv)
		if err != nil && try < strayKills && ctx.Err() == nil && code == 128+int(unix.SIGKILL) {
			continue
		}
		return d, err
	}
}
