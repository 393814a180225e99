package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
)

// GCOptions select what GC does: zero durations do nothing.
type GCOptions struct {
	// SuspendIdle suspends running sandboxes idle (not called) for longer.
	SuspendIdle time.Duration
	// RemoveIdle removes sandboxes, running or suspended, idle for longer.
	RemoveIdle time.Duration
	// DryRun only says what would be done.
	DryRun bool
}

// GCAction is what GC did (or would do) to one sandbox.
type GCAction struct {
	Name string
	// Action is "suspend" or "remove".
	Action string
	Idle   time.Duration
	// Err is why it failed, if it did.
	Err error
}

// GC suspends and removes sandboxes idle for long, as o says: a cron job's
// way to free a worker's memory (suspend) and disk (remove). Sandboxes idle
// in a pool (their pool's idle timeout applies) and those an ephemeral
// owner holds are left alone. One that fails does not stop the others; the
// error joins their failures.
func (m *Manager) GC(ctx context.Context, o GCOptions) ([]GCAction, error) {
	if o.SuspendIdle < 0 || o.RemoveIdle < 0 {
		return nil, fmt.Errorf("gc: idle durations must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	if err := m.Reconcile(ctx); err != nil {
		m.o.warnf("%v", err)
	}
	sbs, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	m.Probe(ctx, sbs...) // a dead sandbox is removed, never suspended
	var acts []GCAction
	var errs []error
	for _, sb := range sbs {
		if sb.OwnerPID != 0 || sb.State == StatePooled {
			continue
		}
		idle := time.Since(sb.LastUsed)
		var a GCAction
		switch {
		case o.RemoveIdle > 0 && idle > o.RemoveIdle && (sb.State == StateRunning || sb.State == StateSuspended || sb.State == StateDead):
			a = GCAction{Name: sb.Name, Action: "remove", Idle: idle}
			if !o.DryRun {
				a.Err = m.Remove(ctx, sb.Name)
			}
		case o.SuspendIdle > 0 && idle > o.SuspendIdle && sb.State == StateRunning:
			a = GCAction{Name: sb.Name, Action: "suspend", Idle: idle}
			if !o.DryRun {
				a.Err = m.Suspend(ctx, sb.Name)
			}
		default:
			continue
		}
		if a.Err != nil {
			errs = append(errs, a.Err)
		}
		acts = append(acts, a)
	}
	return acts, errors.Join(errs...)
}
