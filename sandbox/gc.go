package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
)

// GCOptions select what GC does: zero durations and nil budgets do nothing.
type GCOptions struct {
	// SuspendIdle suspends running sandboxes idle (not called) for longer.
	SuspendIdle time.Duration
	// RemoveIdle removes sandboxes, running or suspended, idle for longer.
	RemoveIdle time.Duration
	// MaxRunning, when not nil, suspends running sandboxes, least recently
	// used first, until at most this many run. Every running sandbox of
	// the state root counts (pooled ones, those an ephemeral owner holds,
	// and those in a call too), though GC never suspends those.
	MaxRunning *int
	// MaxMemory, when not nil, suspends running sandboxes, least recently
	// used first, until the host memory of the running sandboxes is at
	// most this many bytes. A sandbox's host memory is what its memory
	// cgroup holds, less its inactive file cache (as docker stats counts a
	// container's): its gofer's and sentry's memory and gVisor's memory
	// file, which holds its processes' memory and its /tmp. Suspending it
	// frees that.
	MaxMemory *int64
	// DryRun only says what would be done (sandboxes in a call now are
	// left alone, as GC would leave them; one whose call begins meanwhile
	// GC would skip too).
	DryRun bool
}

// GCAction is what GC did (or would do) to one sandbox.
type GCAction struct {
	Name string
	// Action is GCSuspend, GCRemove, or GCSkip: a sandbox the budget would
	// have suspended, left running (said only when the budget is not met).
	Action GCVerb
	// Reason is why: the rule that chose it (GCSuspendIdle, GCRemoveIdle,
	// GCMaxRunning, GCMaxMemory), or why it was skipped (GCInCall).
	Reason GCReason
	Idle   time.Duration
	// MemoryBytes is a running sandbox's host memory (see
	// GCOptions.MaxMemory), when a budget is asked for; 0 if unknown.
	MemoryBytes int64
	// Err is why it failed, if it did.
	Err error
}

// GCVerb is what GC did to a sandbox (GCAction.Action).
type GCVerb string

// GCAction's actions.
const (
	GCSuspend GCVerb = "suspend"
	GCRemove  GCVerb = "remove"
	GCSkip    GCVerb = "skip"
)

// GCReason is why GC chose a sandbox, or skipped it (GCAction.Reason).
type GCReason string

// GCAction's reasons.
const (
	GCSuspendIdle GCReason = "suspend-idle"
	GCRemoveIdle  GCReason = "remove-idle"
	GCMaxRunning  GCReason = "max-running"
	GCMaxMemory   GCReason = "max-memory"
	GCInCall      GCReason = "in a call"
)

// BudgetError is GC's error when its budget (GCOptions.MaxRunning,
// MaxMemory) is not met once it has suspended all it could: the sandboxes
// left running are in a call, pooled, held by an ephemeral owner, or not
// in a state to be suspended. It is errdefs.ErrUnavailable: calls end and
// owners release their sandboxes, and a later GC may meet it.
type BudgetError struct {
	// Running and MemoryBytes are what run after GC (or would, DryRun),
	// against the budget asked for.
	Running     int
	MemoryBytes int64
	MaxRunning  *int
	MaxMemory   *int64
	// InCall name the sandboxes skipped because they were in a call; Held
	// counts the running sandboxes GC never suspends (pooled, held by an
	// ephemeral owner, being created, suspended or resumed, unresponsive)
	// and Failed those whose suspend failed.
	InCall       []string
	Held, Failed int
	DryRun       bool
}

func (e *BudgetError) Error() string {
	var over []string
	if e.MaxRunning != nil && e.Running > *e.MaxRunning {
		runs := "sandboxes run"
		if e.Running == 1 {
			runs = "sandbox runs"
		}
		over = append(over, fmt.Sprintf("%d %s (at most %d wanted)", e.Running, runs, *e.MaxRunning))
	}
	if e.MaxMemory != nil && e.MemoryBytes > *e.MaxMemory {
		over = append(over, fmt.Sprintf("running sandboxes hold %s (at most %s wanted)", units.BytesSize(float64(e.MemoryBytes)), units.BytesSize(float64(*e.MaxMemory))))
	}
	var left []string
	if len(e.InCall) > 0 {
		left = append(left, fmt.Sprintf("%d in a call (%s)", len(e.InCall), strings.Join(e.InCall, ", ")))
	}
	if e.Held > 0 {
		left = append(left, fmt.Sprintf("%d pooled, held by their owner or busy otherwise", e.Held))
	}
	if e.Failed > 0 {
		left = append(left, fmt.Sprintf("%d failed to suspend", e.Failed))
	}
	verb := "is not met"
	if e.DryRun {
		verb = "would not be met"
	}
	return fmt.Sprintf("the budget %s: %s; left running: %s", verb, strings.Join(over, ", "), strings.Join(left, ", "))
}

// Is makes a BudgetError errdefs.ErrUnavailable.
func (e *BudgetError) Is(target error) bool { return target == errdefs.ErrUnavailable }

// GC suspends and removes sandboxes, as o says: a cron job's way to free a
// worker's memory (suspend) and disk (remove), and to keep it under a
// budget of running sandboxes and their memory. It acts on the least
// recently used sandboxes first (removals too: the oldest suspended go
// first), first by idle time (RemoveIdle, SuspendIdle), then by budget
// (MaxRunning, MaxMemory). Sandboxes idle in a pool (their pool's idle
// timeout applies) and those an ephemeral owner holds are left alone, and
// so are those in a call (a call or copy holds a lock that says so, in any
// process: record.Record.Use; one that begins after GC looked makes the
// sandbox's agent refuse the suspend, at once), and GC goes on to the next
// one. One that fails does
// not stop the others; the error joins their failures, and a BudgetError
// if the budget is not met. A negative option is errdefs.ErrInvalidArgument,
// and nothing is done.
func (m *Manager) GC(ctx context.Context, o GCOptions) ([]GCAction, error) {
	if o.SuspendIdle < 0 || o.RemoveIdle < 0 {
		return nil, fmt.Errorf("gc: idle durations must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	if o.MaxRunning != nil && *o.MaxRunning < 0 {
		return nil, fmt.Errorf("gc: the most running sandboxes must not be negative, got %d: %w", *o.MaxRunning, errdefs.ErrInvalidArgument)
	}
	if o.MaxMemory != nil && *o.MaxMemory < 0 {
		return nil, fmt.Errorf("gc: the most memory of running sandboxes must not be negative, got %d bytes: %w", *o.MaxMemory, errdefs.ErrInvalidArgument)
	}
	if err := m.Reconcile(ctx); err != nil {
		m.o.warnf("%v", err)
	}
	sbs, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	sbs = m.Probe(ctx, sbs...) // a dead sandbox is removed, never suspended
	// Least recently used first.
	slices.SortStableFunc(sbs, func(a, b *Sandbox) int {
		if c := a.LastUsed.Compare(b.LastUsed); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	var acts []GCAction
	var errs []error
	gone := map[string]bool{} // suspended or removed by the idle rules
	for _, sb := range sbs {
		if sb.OwnerPID != 0 || sb.State == StatePooled || sb.inCall() {
			continue // a call's idle time counts from its start
		}
		idle := time.Since(sb.LastUsed)
		var a GCAction
		switch {
		case o.RemoveIdle > 0 && idle > o.RemoveIdle && (sb.State == StateRunning || sb.State == StateSuspended || sb.State == StateDead):
			a = GCAction{Name: sb.Name, Action: GCRemove, Reason: GCRemoveIdle, Idle: idle}
			if !o.DryRun {
				a.Err = m.Remove(ctx, sb.Name)
			}
		case o.SuspendIdle > 0 && idle > o.SuspendIdle && sb.State == StateRunning:
			a = GCAction{Name: sb.Name, Action: GCSuspend, Reason: GCSuspendIdle, Idle: idle}
			if !o.DryRun {
				a.Err = m.Suspend(ctx, sb.Name)
			}
		default:
			continue
		}
		switch {
		case a.Err == nil:
			gone[sb.Name] = true
		case a.Action == GCSuspend && inCall(a.Err):
			continue // not idle after all: its call began before SuspendIdle
		default:
			errs = append(errs, a.Err)
		}
		acts = append(acts, a)
	}
	if o.MaxRunning != nil || o.MaxMemory != nil {
		bacts, err := m.suspendForBudget(ctx, o, sbs, gone)
		acts = append(acts, bacts...)
		errs = append(errs, err)
	}
	return acts, errors.Join(errs...)
}

// suspendForBudget suspends sandboxes of sbs (least recently used first)
// until the budget of o is met; gone are those the idle rules took.
func (m *Manager) suspendForBudget(ctx context.Context, o GCOptions, sbs []*Sandbox, gone map[string]bool) ([]GCAction, error) {
	b := gcBudget{maxRunning: o.MaxRunning, maxMemory: o.MaxMemory}
	var cands []budgetSandbox
	unknown := 0
	for _, sb := range sbs {
		if gone[sb.Name] || !holdsMemory(sb.State) {
			continue
		}
		c := budgetSandbox{Name: sb.Name, LastUsed: sb.LastUsed,
			Eligible: sb.State == StateRunning && sb.OwnerPID == 0, InCall: sb.inCall()}
		mem, err := sb.HostMemory()
		if err != nil {
			unknown++
		}
		c.Memory = mem.InUse()
		cands = append(cands, c)
	}
	if unknown > 0 && o.MaxMemory != nil {
		m.o.warnf("gc: the memory of %d of %d running sandboxes is unknown (no memory cgroup where runsc makes it): counted as 0", unknown, len(cands))
	}
	var acts []GCAction
	var errs []error
	failed := 0
	for ctx.Err() == nil {
		pick, _, _ := planBudget(cands, b)
		if len(pick) == 0 {
			break
		}
		c := &cands[pick[0]]
		running, mem := budgetUse(cands)
		a := GCAction{Name: c.Name, Action: GCSuspend, Reason: b.over(running, mem), Idle: time.Since(c.LastUsed), MemoryBytes: c.Memory}
		if !o.DryRun {
			a.Err = m.Suspend(ctx, c.Name)
		}
		switch {
		case a.Err == nil:
			c.Suspended = true
			acts = append(acts, a)
		case inCall(a.Err):
			c.InCall = true
		case errors.Is(a.Err, errdefs.ErrNotFound):
			c.Suspended = true // removed meanwhile: it holds nothing
		default:
			c.Eligible = false
			failed++
			errs = append(errs, a.Err)
			acts = append(acts, a)
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("gc: %w", err))
	}
	_, skipped, met := planBudget(cands, b)
	if met {
		return acts, errors.Join(errs...)
	}
	running, mem := budgetUse(cands)
	berr := &BudgetError{Running: running, MemoryBytes: mem, MaxRunning: o.MaxRunning, MaxMemory: o.MaxMemory,
		Failed: failed, DryRun: o.DryRun}
	for _, i := range skipped {
		c := cands[i]
		acts = append(acts, GCAction{Name: c.Name, Action: GCSkip, Reason: GCInCall, Idle: time.Since(c.LastUsed), MemoryBytes: c.Memory})
		berr.InCall = append(berr.InCall, c.Name)
	}
	for _, c := range cands {
		if !c.Suspended && !c.Eligible {
			berr.Held++
		}
	}
	berr.Held -= failed
	return acts, errors.Join(append(errs, berr)...)
}

// holdsMemory says whether a sandbox in state st has host processes (and
// memory), as far as GC knows.
func holdsMemory(st State) bool {
	switch st {
	case StateRunning, StatePooled, StateUnresponsive, StateCreating, StateSuspending, StateResuming:
		return true
	}
	return false
}

// inCall reports whether a call or copy runs in the sandbox now (see
// record.Record.Use).
func (sb *Sandbox) inCall() bool { return sb.rec != nil && sb.rec.InCall() }

// inCall says whether err, from Suspend, is its agent's refusal because a
// call runs (one that began after GC looked). The agent says so only in words (its Result's Error), which
// Suspend passes on as a failed precondition.
func inCall(err error) bool {
	return errors.Is(err, errdefs.ErrFailedPrecondition) && strings.Contains(err.Error(), "calls are running")
}

// gcBudget is GCOptions' budget: nil is no such rule.
type gcBudget struct {
	maxRunning *int
	maxMemory  *int64
}

// over says which rule of the budget running sandboxes holding mem bytes
// break (GCMaxRunning first), "" if none.
func (b gcBudget) over(running int, mem int64) GCReason {
	switch {
	case b.maxRunning != nil && running > *b.maxRunning:
		return GCMaxRunning
	case b.maxMemory != nil && mem > *b.maxMemory:
		return GCMaxMemory
	}
	return ""
}

// budgetSandbox is a sandbox with host processes, as GC's budget sees it.
type budgetSandbox struct {
	Name     string
	LastUsed time.Time
	// Memory is its host memory in bytes (0 if unknown).
	Memory int64
	// Eligible: GC may suspend it (running, not pooled, no owner).
	Eligible bool
	// InCall: a call runs in it (its agent refused a suspend).
	InCall bool
	// Suspended: GC suspended it (or it is gone); it no longer counts.
	Suspended bool
}

// budgetUse is how many of cands run, and their memory.
func budgetUse(cands []budgetSandbox) (running int, mem int64) {
	for _, c := range cands {
		if !c.Suspended {
			running++
			mem += c.Memory
		}
	}
	return running, mem
}

// planBudget chooses which of cands to suspend so that the budget b is met:
// the eligible ones not in a call, least recently used first (by LastUsed,
// then name), until it is. skipped are those in a call that it passed over
// while the budget was not met, and met says whether it is met once the
// chosen ones are suspended. cands is not changed.
func planBudget(cands []budgetSandbox, b gcBudget) (suspend, skipped []int, met bool) {
	running, mem := budgetUse(cands)
	order := make([]int, 0, len(cands))
	for i, c := range cands {
		if c.Eligible && !c.Suspended {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(i, j int) int {
		if c := cands[i].LastUsed.Compare(cands[j].LastUsed); c != 0 {
			return c
		}
		return strings.Compare(cands[i].Name, cands[j].Name)
	})
	for _, i := range order {
		if b.over(running, mem) == "" {
			break
		}
		if cands[i].InCall {
			skipped = append(skipped, i)
			continue
		}
		suspend = append(suspend, i)
		running--
		mem -= cands[i].Memory
	}
	return suspend, skipped, b.over(running, mem) == ""
}
