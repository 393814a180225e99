package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/workers"
	"github.com/flmbox/flmbox/snippet/wire"
)

// MaxBatch is the most snippets a batch holds.
const MaxBatch = 64

// Target is where a batch runs: in fresh sandboxes made from Spec, or side
// by side in the existing sandbox named Sandbox. Exactly one is set.
type Target struct {
	Sandbox string
	Spec    *Spec
}

// BatchResult is the outcome of one snippet of a batch. Ran says whether
// the snippet was sent to a sandbox at all; if it was, Result is its result
// or Err why flmbox could not run it (the sandbox could not be made, or
// died). A snippet that did not run (the batch was cancelled first) has
// neither; one that the cancellation stopped has a Result that says
// Interrupted, with what it printed until then.
type BatchResult struct {
	Ran    bool
	Result *Result
	Err    error
}

// Batch runs reqs, at most parallel at once (0: the number of CPUs), and
// returns their results in input order. A snippet that fails, or that flmbox
// fails to run, never keeps the others from running. The error is for a
// batch that cannot run at all (errdefs.ErrInvalidArgument).
//
// In fresh sandboxes (Target.Spec), each of the parallel workers acquires
// a clean sandbox (Acquire: from the pool of the spec's shape, or new) and
// runs its snippets there one after another, resetting the sandbox before
// each one but the first (Request.Reset), so that every snippet starts in a
// clean sandbox and none sees another's /tmp, for the price of one sandbox
// per worker. A worker whose sandbox failed acquires a new one for its next
// snippet; the sandboxes are released at the end (Release), or removed by
// Reconcile if this process is killed first (Spec.Ephemeral).
// In an existing sandbox (Target.Sandbox), the snippets run side by
// side and share its /tmp, as its sequential calls do.
func (m *Manager) Batch(ctx context.Context, target Target, reqs []Request, parallel int) ([]BatchResult, error) {
	if (target.Sandbox == "") == (target.Spec == nil) {
		return nil, fmt.Errorf("batch: name a sandbox or a spec for new ones, not both or neither: %w", errdefs.ErrInvalidArgument)
	}
	if n := len(reqs); n == 0 || n > MaxBatch {
		return nil, fmt.Errorf("batch: a batch holds 1 to %d snippets, this one %d: %w", MaxBatch, n, errdefs.ErrInvalidArgument)
	}
	for i, r := range reqs {
		if len(r.CopyIn) > 0 {
			return nil, fmt.Errorf("batch: snippet %d copies files in (CopyIn): a batch takes none; copy them in a snippet of its own: %w", i, errdefs.ErrInvalidArgument)
		}
	}
	if target.Spec != nil && target.Spec.Name != "" {
		return nil, fmt.Errorf("batch: the sandboxes of a batch are named by flmbox, not %q: %w", target.Spec.Name, errdefs.ErrInvalidArgument)
	}
	if target.Spec != nil && len(target.Spec.Pip) > 0 {
		// A batch resets its sandboxes between snippets, emptying /tmp.
		return nil, fmt.Errorf("batch: preinstalled pip requirements do not apply to a batch, whose snippets each start with an empty /tmp: %w", errdefs.ErrInvalidArgument)
	}
	if target.Spec != nil {
		// A bad spec fails the batch, not each snippet.
		if _, err := target.Spec.withDefaults(m.root); err != nil {
			return nil, fmt.Errorf("batch: %w", err)
		}
		spec := *target.Spec
		spec.Ephemeral = true
		target.Spec = &spec
	}
	wreqs := make([]*wire.Request, len(reqs))
	for i, r := range reqs {
		if r.Reset {
			return nil, fmt.Errorf("batch: snippet %d: Reset does not apply to a batch: %w", i, errdefs.ErrInvalidArgument)
		}
		var err error
		if wreqs[i], err = r.wire(); err != nil {
			return nil, fmt.Errorf("batch: snippet %d: %w", i, err)
		}
	}
	out := make([]BatchResult, len(reqs))
	workers.Run(ctx, len(reqs), parallel, func(next <-chan int) {
		w := &batchWorker{m: m, target: target}
		defer w.close(ctx)
		for i := range next {
			out[i] = w.run(ctx, wreqs[i], reqs[i].Callback)
		}
	})
	return out, nil
}

// batchWorker runs batch snippets one at a time, in its own sandbox when
// the target is a spec.
type batchWorker struct {
	m      *Manager
	target Target
	sb     string // its own sandbox, once made
}

func (w *batchWorker) run(ctx context.Context, req *wire.Request, cb *Callback) BatchResult {
	name := w.target.Sandbox
	if name == "" {
		if w.sb == "" {
			sb, err := w.m.Acquire(ctx, *w.target.Spec)
			if err != nil {
				return BatchResult{Ran: true, Err: err}
			}
			w.sb = sb.Name
		} else {
			req.Reset = true
		}
		name = w.sb
	}
	res, err := w.m.callChecked(ctx, named(name), req, cb)
	if errors.Is(err, ErrInterrupted) && res != nil && res.Interrupted {
		return BatchResult{Ran: true, Result: fromWire(res)} // what it printed until the batch was cancelled
	}
	if err == nil && res.Error != "" && req.Reset {
		// The reset failed: the sandbox is not clean.
		err = fmt.Errorf("reset sandbox %q: %s: %w", name, res.Error, errdefs.ErrUnknown)
	}
	if err != nil {
		w.close(ctx) // a new sandbox for the next snippet
		return BatchResult{Ran: true, Err: err}
	}
	out, err := publicResult(named(name), req, res, nil) // a *NotRunError leaves the sandbox as it was
	return BatchResult{Ran: true, Result: out, Err: err}
}

// close gives back the worker's sandbox, if it has one (Release).
func (w *batchWorker) close(ctx context.Context) {
	if w.sb == "" {
		return
	}
	if err := w.m.Release(context.WithoutCancel(ctx), w.sb); err != nil {
		w.m.o.warnf("%v", err)
	}
	w.sb = ""
}
