package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox/record"
)

// State is a sandbox's state.
type State string

// A sandbox's states (see the package documentation).
const (
	// StateCreating: Create is at work (or was killed: Reconcile removes it).
	StateCreating State = "creating"
	// StateRunning: its agent answers calls.
	StateRunning State = "running"
	// StateDead: its gVisor processes are gone; it can only be removed.
	StateDead State = "dead"
	// StateUnresponsive: its agent accepts connections but does not answer
	// (its gVisor sandbox is stopped or starved); calls fail within seconds
	// (sandbox/record's ErrUnresponsive). It may come back.
	StateUnresponsive State = "unresponsive"
	// StateRemoving: Remove is at work (or was killed: Reconcile finishes).
	StateRemoving State = "removing"
	// StatePooled: running, reset, idle in the pool of its shape for the
	// next Acquire; it takes no calls.
	StatePooled State = "pooled"
	// StateSuspended: saved in its checkpoint image, with no process
	// (Suspend); Resume brings it back. StateSuspending and StateResuming:
	// Suspend or Resume is at work (or was killed: Reconcile ends it).
	StateSuspended  State = "suspended"
	StateSuspending State = "suspending"
	StateResuming   State = "resuming"
)

// Sandbox describes a sandbox.
type Sandbox struct {
	Name string
	// Image is the image it was created from, as given; Manifest the
	// digest of the cached image it runs (and leases).
	Image, Manifest string
	Network         runtime.Network
	Platform        string // gVisor's; empty: runsc's default
	Limits          runtime.Limits
	State           State
	Created         time.Time
	// LastUsed is when it was last called, or created.
	LastUsed time.Time
	// OwnerPID is the pid of the process it belongs to (Spec.Ephemeral),
	// which removes it when done (or Reconcile, once that process is
	// gone); 0 if none.
	OwnerPID int
	// ImageBytes is the size of a suspended sandbox's checkpoint image.
	ImageBytes int64
	// Shape names what it is made of (see Pool); sandboxes of one shape
	// share a pool. Empty for sandboxes made before pools.
	Shape string
	// ID is its runsc container ID, and Bundle its OCI bundle directory
	// (config.json): for tools that measure or inspect runsc itself. Never
	// change what is there.
	ID, Bundle string
}

// sandbox describes the sandbox of rec. A running one's state is checked
// (runsc's state, zombie-aware, and its agent must both answer) if check.
func (m *Manager) sandbox(ctx context.Context, rec *record.Record, check bool) *Sandbox {
	sb := &Sandbox{Name: rec.Name, Image: rec.Image, Manifest: rec.Manifest, Network: runtime.Network(rec.Network),
		Platform: rec.Platform, Limits: runtimeLimits(rec.Limits), State: State(rec.State), Created: rec.Created,
		LastUsed: rec.LastUsed(), ID: rec.ID, Bundle: rec.Dir, Shape: rec.Shape}
	if rec.Owner != nil {
		sb.OwnerPID = rec.Owner.PID
	}
	if check && sb.State == StateRunning {
		sb.State = m.check(ctx, rec)
	}
	if sb.State == StateRunning && rec.Pooled != nil {
		sb.State = StatePooled
	}
	if sb.State == StateSuspended {
		sb.ImageBytes = checkpointBytes(rec)
	}
	return sb
}

// check returns the state of a running sandbox: dead unless runsc says its
// processes run and its agent accepts a connection, unresponsive unless the
// agent answers a ping.
func (m *Manager) check(ctx context.Context, rec *record.Record) State {
	if rt, err := m.runtime(); err == nil && !rt.Alive(ctx, container(rec)) {
		return StateDead // without runsc, the agent's word alone
	}
	switch err := rec.Ping(ctx); {
	case err == nil:
		return StateRunning
	case errors.Is(err, record.ErrUnresponsive):
		return StateUnresponsive
	}
	return StateDead
}

// Get describes sandbox name, its state checked (errdefs.ErrNotFound if
// there is no such sandbox). What a killed Create or Remove left of it, or
// an ephemeral sandbox whose owner is gone, is removed first (see
// Reconcile).
func (m *Manager) Get(ctx context.Context, name string) (*Sandbox, error) {
	rec, err := record.Read(m.root, name)
	if err != nil {
		return nil, err
	}
	if rec.State != record.Running || rec.Owner.Gone() {
		if gone, err := m.reconcileDir(ctx, rec.Dir); err != nil {
			return nil, err
		} else if gone {
			return nil, fmt.Errorf("no sandbox %q: %w", name, errdefs.ErrNotFound)
		}
	}
	return m.sandbox(ctx, rec, true), nil
}

// List describes every sandbox, oldest first, their states checked. It
// reconciles first (see Reconcile).
func (m *Manager) List(ctx context.Context) ([]*Sandbox, error) {
	if err := m.Reconcile(ctx); err != nil {
		m.o.warnf("%v", err)
	}
	ents, err := os.ReadDir(filepath.Join(m.root, "sandboxes"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var out []*Sandbox
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if rec, err := record.Read(m.root, e.Name()); err == nil {
			out = append(out, m.sandbox(ctx, rec, true))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// RunscArgs returns the arguments of a runsc command on sb: runsc's global
// flags as flmbox passes them on every call of the sandbox, then args; and
// the runsc binary. It is for tools and measurements that run runsc
// themselves (runsc exec).
func (m *Manager) RunscArgs(sb *Sandbox, args ...string) (runsc string, argv []string, err error) {
	rt, err := m.runtime()
	if err != nil {
		return "", nil, err
	}
	c := runtime.Container{ID: sb.ID, Network: sb.Network, Platform: sb.Platform}
	return rt.Runsc(), rt.Args(c, args...), nil
}
