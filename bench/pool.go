package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/flmbox/flmbox/internal/procmem"
	"github.com/flmbox/flmbox/sandbox"
)

// poolEnv sets the shape of the bench's pool apart from the sandboxes that
// `flmbox run --image` creates in the allocation pairs (an environment
// setting is part of a shape), so that those never adopt from it.
const poolEnv = "FLMBOX_BENCH_POOL=1"

// poolSpec is a sandbox of the bench's pool.
func (r *runner) poolSpec() sandbox.Spec {
	return sandbox.Spec{Image: r.ref, Env: []string{poolEnv}}
}

// fillPool makes the bench's pool: one idle sandbox.
func (r *runner) fillPool(ctx context.Context) error {
	_, err := r.m.FillPool(ctx, r.poolSpec(), sandbox.PoolOptions{Size: 1}, 1)
	return err
}

// drainPool removes the bench's pool.
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
		cmd := r.flmbox(ctx, "run", "--image", r.ref, "--env", poolEnv, "-c", pythonSnippet.code)
		out, exit, err := timeOutputExit(cmd, wantOutput)
		if err == nil {
			*release = append(*release, ms(exit-out))
		}
		return out, err
	}
}

// measurePoolMemory measures the host memory of one idle pooled sandbox
// that has served a call and been reset, measured as measureMemory does
// (after Idle, alone: run it when no other sandbox of the bench runs).
func (r *runner) measurePoolMemory(ctx context.Context) (PoolMemory, error) {
	var rep PoolMemory
	r.logf("memory: one idle pooled sandbox, used once")
	if err := r.fillPool(ctx); err != nil {
		return rep, err
	}
	defer r.drainPool(context.WithoutCancel(ctx))
	if _, _, err := timeOutputExit(r.flmbox(ctx, "run", "--image", r.ref, "--env", poolEnv, "-c", pythonSnippet.code), wantOutput); err != nil {
		return rep, err
	}
	pools, err := r.m.Pools(ctx, false)
	if err != nil {
		return rep, err
	}
	var id string
	for _, p := range pools {
		if p.Spec.Image == r.ref && len(p.Idle) == 1 {
			id = p.Idle[0].ID
		}
	}
	if id == "" {
		return rep, fmt.Errorf("memory: the pool holds no idle sandbox after its use")
	}
	select {
	case <-ctx.Done():
		return rep, ctx.Err()
	case <-time.After(r.opts.Idle):
	}
	pids, err := procmem.Container(id)
	if err != nil {
		return rep, err
	}
	mem, err := procmem.Of(pids)
	if err != nil {
		return rep, err
	}
	rep.IdleKiB, rep.IdleRSSKiB, rep.Processes = mem.PSS, mem.RSS, mem.Processes
	return rep, nil
}
