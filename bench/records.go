package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

// recordsSandboxes is how many sandboxes List lists in the bench.
const recordsSandboxes = 10

// recordsRounds is how many Gets, Lists and Probes are measured.
const recordsRounds = 50

// measureRecords times, in this process, Manager.Get of the warm sandbox
// and Manager.List and Manager.Probe of recordsSandboxes running
// sandboxes (warm and new ones with lazy spares, which cost less memory and
// list alike): Get and List read records and run nothing; Probe pings each
// agent, all at once.
func (r *runner) measureRecords(ctx context.Context, warm *sandbox.Sandbox) (_ Records, err error) {
	rep := Records{Sandboxes: recordsSandboxes}
	r.logf("records: Get of a sandbox, List and Probe of %d", recordsSandboxes)
	var made []string
	defer func() {
		for _, name := range made {
			err = errors.Join(err, r.m.Remove(context.WithoutCancel(ctx), name))
		}
	}()
	for i := 1; i < recordsSandboxes; i++ {
		spec := r.spec(fmt.Sprintf("bench-records-%d", i))
		spec.LazySpares = true
		sb, err := r.m.Create(ctx, spec)
		if err != nil {
			return rep, err
		}
		made = append(made, sb.Name)
	}
	var get, list, probe []float64
	for i := -1; i < recordsRounds; i++ {
		start := time.Now()
		if _, err := r.m.Get(ctx, warm.Name); err != nil {
			return rep, err
		}
		dg := time.Since(start)
		start = time.Now()
		sbs, err := r.m.List(ctx)
		if err != nil {
			return rep, err
		}
		dl := time.Since(start)
		// Others may be in the root (a pool's, refilled in the
		// background): the bench probes its own.
		sbs = slices.DeleteFunc(sbs, func(sb *sandbox.Sandbox) bool { return sb.Name != warm.Name && !slices.Contains(made, sb.Name) })
		if len(sbs) != recordsSandboxes {
			return rep, fmt.Errorf("records: List gave %d of the bench's sandboxes, want %d", len(sbs), recordsSandboxes)
		}
		start = time.Now()
		sbs = r.m.Probe(ctx, sbs...)
		dp := time.Since(start)
		for _, sb := range sbs {
			if sb.State != sandbox.StateRunning {
				return rep, fmt.Errorf("records: Probe says %s is %s", sb.Name, sb.State)
			}
		}
		if i >= 0 {
			get, list, probe = append(get, ms(dg)), append(list, ms(dl)), append(probe, ms(dp))
		}
	}
	rep.GetMS, rep.ListMS, rep.ProbeMS = summarize(get), summarize(list), summarize(probe)
	return rep, nil
}
