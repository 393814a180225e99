package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/snippet/wire"
)

// warmMethod is one way of making a warm call, and its measured rounds.
type warmMethod struct {
	name   string
	call   func(ctx context.Context) (time.Duration, error)
	rounds [][]float64
}

// measureWarm measures warm calls on the persistent sandbox sb, for each
// language: through `flmbox run --sandbox` and `flmbox run --batch --sandbox`
// (a batch of one), both as whole processes and in this process, against
// runsc exec of the same command in sb and the same command under chroot.
func (b *bench) measureWarm(ctx context.Context, sb *runtime.Sandbox) ([]warmReport, error) {
	batchCLI, err := benchContext(b.cli, "--root", b.root, "--runsc", b.runsc, "--sandbox", sb.Name)
	if err != nil {
		return nil, err
	}
	var out []warmReport
	for _, s := range []benchSnippet{pythonSnippet, shellSnippet} {
		batchFile := filepath.Join(b.dir, "warm-batch-"+s.language+".json")
		data, _ := json.Marshal(batchInput{Language: s.language, Codes: []batchItem{{Code: s.code}}})
		if err := os.WriteFile(batchFile, data, 0o600); err != nil {
			return nil, err
		}
		methods := []*warmMethod{
			{name: "flmbox run --sandbox", call: func(ctx context.Context) (time.Duration, error) {
				return checkedCommand(b.flmbox(ctx, "run", "--sandbox", sb.Name, "--language", s.language, "-c", s.code))
			}},
			{name: "wire.Call", call: func(ctx context.Context) (time.Duration, error) { return callAgent(ctx, sb, s) }},
			{name: "flmbox run --batch --sandbox", call: func(ctx context.Context) (time.Duration, error) {
				return b.batchCall(ctx, b.flmbox(ctx, "run", "--batch", batchFile, "--sandbox", sb.Name))
			}},
			{name: "batch in process", call: func(ctx context.Context) (time.Duration, error) {
				start := time.Now()
				res := runBatch(batchCLI, []*wire.Request{s.request()}, 0)
				d := time.Since(start)
				return d, checkBatch("the batch runner", res)
			}},
			{name: "runsc exec", call: func(ctx context.Context) (time.Duration, error) {
				return checkedCommand(b.runscExec(ctx, sb, s.argv))
			}},
			{name: "chroot", call: func(ctx context.Context) (time.Duration, error) {
				return checkedCommand(b.native(ctx, s.argv))
			}},
		}
		b.logf("warm calls: %s", s.language)
		if err := b.runWarm(ctx, methods); err != nil {
			return nil, err
		}
		rx, rp := roundSummary(methods[4].rounds)
		nx, np := roundSummary(methods[5].rounds)
		for i, api := range []string{"sandbox", "batch"} {
			cli, inproc := methods[2*i], methods[2*i+1]
			r := warmReport{API: api, Language: s.language, RunscExecMedianMS: rx, RunscExecP95MS: rp,
				NativeMedianMS: nx, NativeP95MS: np, Calls: b.opts.rounds * b.opts.calls}
			r.MedianMS, r.P95MS = roundSummary(cli.rounds)
			r.InprocessMedianMS, r.InprocessP95MS = roundSummary(inproc.rounds)
			out = append(out, r)
		}
	}
	return out, nil
}

// runWarm makes --warmup calls of each method, then --rounds rounds of
// --calls calls of each, rotating which method goes first; --pause before
// each measured call.
func (b *bench) runWarm(ctx context.Context, methods []*warmMethod) error {
	for _, m := range methods {
		for range b.opts.warmup {
			if _, err := m.call(ctx); err != nil {
				return fmt.Errorf("warm-up call (%s): %w", m.name, err)
			}
		}
	}
	for r := range b.opts.rounds {
		for j := range methods {
			m := methods[(r+j)%len(methods)]
			xs := make([]float64, 0, b.opts.calls)
			for range b.opts.calls {
				if b.opts.pause > 0 {
					select {
					case <-time.After(b.opts.pause):
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
func (b *bench) batchCall(ctx context.Context, cmd *exec.Cmd) (time.Duration, error) {
	d, out, err := timeCommand(cmd)
	if err != nil {
		return d, err
	}
	var res []batchResult
	if err := json.Unmarshal(out, &res); err != nil {
		return d, fmt.Errorf("check the output of %s: %w: %q", commandLine(cmd), err, out)
	}
	return d, checkBatch(commandLine(cmd), res)
}

// checkBatch fails unless a batch of one printed exactly benchWant.
func checkBatch(what string, res []batchResult) error {
	if len(res) != 1 {
		return fmt.Errorf("check the result of %s: %d results, want 1", what, len(res))
	}
	return checkResult(what, res[0].ExitCode, res[0].Stdout, res[0].Stderr)
}

// runscExec returns runsc exec of argv in sb, with the sandbox's own runsc
// root and global flags (runtime.Runtime keeps its runsc root in ROOT/runsc).
func (b *bench) runscExec(ctx context.Context, sb *runtime.Sandbox, argv []string) *exec.Cmd {
	return exec.CommandContext(ctx, b.runsc, runtime.RunscArgs(b.root, sb, append([]string{"exec", sb.ID}, argv...)...)...)
}

// native returns argv under chroot on the cached rootfs, as the sandbox's
// user and with its environment: the same command without a sandbox.
func (b *bench) native(ctx context.Context, argv []string) *exec.Cmd {
	uid := fmt.Sprintf("--userspec=%d:%d", sandboxUID, sandboxGID)
	cmd := exec.CommandContext(ctx, "chroot", append([]string{uid, b.img.Rootfs}, argv...)...)
	cmd.Env = sandboxEnv(b.imageEnv, nil)
	return cmd
}
