package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/flmbox/flmbox/internal/procmem"
	"github.com/flmbox/flmbox/sandbox"
)

// poolTmpBytes sets the shape of the bench's pool apart from the sandboxes
// that `flmbox run --image` creates in the allocation pairs (the size of
// /tmp is part of a shape; run's --env is the call's, not the shape's), so
// that those never adopt from it.
const poolTmpBytes = sandbox.DefaultTmpBytes - 1<<20

// poolTmpSize is poolTmpBytes as run's --tmp-size.
var poolTmpSize = strconv.FormatInt(poolTmpBytes, 10)

// poolSpec is a sandbox of the bench's pool.
func (r *runner) poolSpec() sandbox.Spec {
	return sandbox.Spec{Image: r.ref, TmpBytes: poolTmpBytes}
}

// fillPool makes the bench's pool: one idle sandbox.
func (r *runner) fillPool(ctx context.Context) error {
	_, err := r.m.FillPool(ctx, r.poolSpec(), sandbox.PoolOptions{Size: 1, Parallel: 1})
	return err
}

// drainPool removes the bench's pools.
func (r *runner) drainPool(ctx context.Context) error {
	_, err := r.m.DrainPools(ctx, sandbox.DrainOptions{Image: r.ref})
	return err
}

// pooledAllocator times a whole `flmbox run --image` process that adopts a
// clean sandbox from a warm pool of one, until its output is back; how long
// the process takes after that (the reset that puts the sandbox back into
// the pool) goes into release.
func (r *runner) pooledAllocator(release *[]float64) allocator {
	return func(ctx context.Context) (time.Duration, error) {
		cmd := r.flmbox(ctx, "run", "--image", r.ref, "--tmp-size", poolTmpSize, "-c", pythonSnippet.code)
		out, exit, err := timeOutputExit(cmd, wantOutput)
		if err == nil {
			*release = append(*release, ms(exit-out))
		}
		return out, err
	}
}

// measurePoolMemory measures the host memory of idle pooled sandboxes that
// have each served a call and been reset, one of flmbox's default spares
// and one with lazy spares (each its own pool of one), beside a bare runsc
// container: all three alive at once, left idle for Idle, measured one
// right after the other. PSS splits the pages processes share evenly among
// them, runsc's own text above all (some 28 MiB, the larger part of an idle
// sandbox's PSS when it runs alone): measured side by side, each container
// gets the same share of it, whatever else runs on the host.
func (r *runner) measurePoolMemory(ctx context.Context) (rep PoolMemory, err error) {
	r.logf("memory: idle pooled sandboxes, used once (default and lazy spares), beside a bare runsc container")
	defer r.drainPool(context.WithoutCancel(ctx))
	lazy := r.poolSpec()
	lazy.LazySpares = true
	for _, spec := range []sandbox.Spec{r.poolSpec(), lazy} {
		if _, err := r.m.FillPool(ctx, spec, sandbox.PoolOptions{Size: 1, Parallel: 1}); err != nil {
			return rep, err
		}
		args := []string{"run", "--image", r.ref, "--tmp-size", poolTmpSize}
		if spec.LazySpares {
			args = append(args, "--lazy-spares")
		}
		if _, _, err := timeOutputExit(r.flmbox(ctx, append(args, "-c", pythonSnippet.code)...), wantOutput); err != nil {
			return rep, err
		}
	}
	ids := map[bool]string{} // by LazySpares
	pools, err := r.m.Pools(ctx, sandbox.PoolsOptions{})
	if err != nil {
		return rep, err
	}
	for _, p := range pools {
		if p.Spec.Image == r.ref && len(p.Idle) == 1 {
			ids[p.Spec.LazySpares] = p.Idle[0].ID
		}
	}
	if ids[false] == "" || ids[true] == "" {
		return rep, fmt.Errorf("memory: the pools hold no idle sandbox after their use")
	}
	bare := newRawID()
	defer r.deleteRaw(context.WithoutCancel(ctx), bare)
	if err := r.startRaw(ctx, bare); err != nil {
		return rep, err
	}
	select {
	case <-ctx.Done():
		return rep, ctx.Err()
	case <-time.After(r.opts.Idle):
	}
	for _, m := range []struct {
		id        string
		pss, rss  *int64
		processes *int
	}{
		{ids[false], &rep.IdleKiB, &rep.IdleRSSKiB, &rep.Processes},
		{ids[true], &rep.LazyIdleKiB, &rep.LazyIdleRSSKiB, &rep.LazyProcesses},
		{bare, &rep.BareKiB, &rep.BareRSSKiB, &rep.BareProcesses},
	} {
		pids, err := procmem.Container(m.id)
		if err != nil {
			return rep, err
		}
		mem, err := procmem.Of(pids)
		if err != nil {
			return rep, err
		}
		*m.pss, *m.rss, *m.processes = mem.PSS, mem.RSS, mem.Processes
	}
	return rep, nil
}
