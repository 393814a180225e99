package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox/record"
)

// State is a sandbox's state: one its record holds, or one that a look at
// the sandbox finds (dead, unresponsive, pooled).
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
	// (ErrUnresponsive). It may come back.
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

// Sandbox is one sandbox of a Manager, as a caller holds it: its fields
// describe the sandbox as it was when read (by Create, Acquire, Get or List),
// and its methods act on the sandbox as it is now, each as the Manager's
// method of the same name does on its Name.
type Sandbox struct {
	Name string
	// Image is the image it was created from, as given; Manifest the
	// digest of the cached image it runs (and leases).
	Image, Manifest string
	Network         Network
	Platform        string // gVisor's; empty: runsc's default
	Limits          Limits
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
	// Labels are its holder's (Spec.Labels); nil if none.
	Labels map[string]string
	// ID is its runsc container ID, and Bundle its OCI bundle directory
	// (config.json): for tools that measure or inspect runsc itself. Never
	// change what is there.
	ID, Bundle string
	// Egress is an egress sandbox's policy and what it refused, as Get and
	// List read it (nil for other networks, and from Create or Acquire,
	// whose sandbox has refused nothing yet to its new holder).
	Egress *EgressStatus

	m       *Manager
	rec     *record.Record // what it was read from, for Probe
	handOut string         // the holding it was given with (target)
}

// sandbox describes the sandbox of rec, in the state its record says, or
// dead if its record names a gVisor sandbox process that is gone (one
// read of /proc: see record.Process.Gone).
func (m *Manager) sandbox(rec *record.Record) *Sandbox {
	sb := &Sandbox{Name: rec.Name, Image: rec.Image, Manifest: rec.Manifest, Network: Network(rec.Network),
		Platform: rec.Platform, Limits: Limits(rec.Limits), State: State(rec.State), Created: rec.Created,
		LastUsed: rec.LastUsed(), ID: rec.ID, Bundle: rec.Dir, Shape: rec.Shape, Labels: maps.Clone(rec.Labels), m: m, rec: rec,
		handOut: rec.HandOut}
	if rec.Owner != nil {
		sb.OwnerPID = rec.Owner.PID
	}
	if sb.State == StateRunning && rec.Pooled != nil {
		sb.State = StatePooled
	}
	if sb.State == StateRunning || sb.State == StatePooled {
		if rec.Process.Gone() {
			sb.State = StateDead
		}
	}
	if sb.State == StateSuspended {
		sb.ImageBytes = checkpointBytes(rec)
	}
	return sb
}

// sandboxProcess is process pid, the gVisor sandbox process runsc started
// for a sandbox, as its record keeps it: nil if /proc has no such process
// (the sandbox is then dead, and waiting for its agent fails).
func sandboxProcess(pid int) *record.Process {
	p, err := record.ProcessOf(pid)
	if err != nil {
		return nil
	}
	return p
}

// ProbeTimeout bounds Probe's check of one sandbox: its agent's ping
// (a few seconds) and, if that fails, runsc's state.
const ProbeTimeout = record.PingTimeout + 2*time.Second

// maxProbes is how many sandboxes Probe checks at once.
const maxProbes = 16

// Probe checks whether the agents of the running and pooled sandboxes among
// sbs answer, and returns sbs as they are now, in order: copies whose State is
// StateDead if their gVisor processes are gone, StateUnresponsive if their
// agent does not answer (or nothing answered within ProbeTimeout: not known
// dead), as read otherwise (sbs themselves are left as they were). A
// sandbox whose agent answers a ping costs about a millisecond and no runsc;
// the others are asked of runsc too. Sandboxes are checked at once (up to 16
// at a time), each within ProbeTimeout, so that one that hangs never delays
// or mislabels another.
func (m *Manager) Probe(ctx context.Context, sbs ...*Sandbox) []*Sandbox {
	out := make([]*Sandbox, len(sbs))
	sem := make(chan struct{}, maxProbes)
	var wg sync.WaitGroup
	for i, sb := range sbs {
		if sb == nil {
			continue
		}
		now := *sb
		out[i] = &now
		if sb.State != StateRunning && sb.State != StatePooled {
			continue
		}
		rec := sb.rec
		if rec == nil {
			var err error
			if rec, err = record.Read(m.root, sb.Name); err != nil || rec.ID != sb.ID {
				continue
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
			defer cancel()
			if st := m.check(pctx, rec); st != StateRunning {
				now.State = st
			}
		}()
	}
	wg.Wait()
	return out
}

// check returns the state of a running sandbox: running if its agent
// answers a ping; else dead if runsc says its processes are gone (zombies
// count as gone), unresponsive if not (or if nothing answered before ctx
// ended: it may be alive).
func (m *Manager) check(ctx context.Context, rec *record.Record) State {
	err := rec.Ping(ctx)
	if err == nil {
		return StateRunning
	}
	if rt, rerr := m.runtime(); rerr == nil {
		// Dead when runsc says so; a runsc that hangs or fails says
		// nothing of the sandbox.
		running, serr := rt.Running(ctx, container(rec))
		switch {
		case serr == nil && !running && ctx.Err() == nil:
			return StateDead
		case serr != nil:
			return StateUnresponsive
		}
	}
	if errors.Is(err, record.ErrUnresponsive) || ctx.Err() != nil {
		return StateUnresponsive
	}
	return StateDead // its agent refuses connections
}

// Get describes sandbox name as its record says, or dead if its gVisor
// sandbox process is gone (errdefs.ErrNotFound if there is no such
// sandbox): it reads the record and /proc, and runs and changes nothing.
// Probe checks whether a running one's agent answers; Reconcile removes
// what a killed Create or Remove left (a sandbox that stays creating or
// removing), and ephemeral sandboxes whose owner is gone.
func (m *Manager) Get(ctx context.Context, name string) (*Sandbox, error) {
	rec, err := record.Read(m.root, name)
	if err != nil {
		return nil, err
	}
	return m.described(rec), nil
}

// described is m.sandbox(rec) with, for an egress sandbox, what it refused
// (its table's counters and its resolver's file: Get and List, not the
// handles Create and Acquire return).
func (m *Manager) described(rec *record.Record) *Sandbox {
	sb := m.sandbox(rec)
	if sb.Network == NetworkEgress {
		sb.Egress = egressStatus(rec)
	}
	return sb
}

// List describes every sandbox, oldest first, as Get does: it reads
// records and /proc, and runs and changes nothing (tens of microseconds a
// sandbox). Probe checks which running ones' agents answer; Reconcile
// removes what killed flmbox processes left.
func (m *Manager) List(ctx context.Context) ([]*Sandbox, error) {
	ents, err := os.ReadDir(stateroot.Sandboxes(m.root))
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
			out = append(out, m.described(rec))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// ListLabeled is List of the sandboxes that have every label of sel (an
// empty value: the key, whatever its value; see Sandbox.HasLabels).
func (m *Manager) ListLabeled(ctx context.Context, sel map[string]string) ([]*Sandbox, error) {
	all, err := m.List(ctx)
	var out []*Sandbox
	for _, sb := range all {
		if sb.HasLabels(sel) {
			out = append(out, sb)
		}
	}
	return out, err
}

// HostMemory is the host memory a running sandbox's memory cgroup holds, in
// bytes: Charged is all charged to it (its gofer's and sentry's memory,
// gVisor's memory file with its processes' memory and its /tmp, page cache
// they read, kernel memory), InactiveFile the part that is inactive file
// cache, which the kernel reclaims first.
type HostMemory struct{ Charged, InactiveFile int64 }

// InUse is Charged less InactiveFile, as docker stats counts a
// container's memory: what suspending the sandbox frees.
func (h HostMemory) InUse() int64 { return h.Charged - h.InactiveFile }

// HostMemory reads what the running sandbox's memory cgroup holds: two
// small reads (errdefs.ErrNotFound if it has none where runsc makes them).
func (sb *Sandbox) HostMemory() (HostMemory, error) {
	m, err := runtime.ContainerMemory(sb.ID)
	if err != nil {
		return HostMemory{}, fmt.Errorf("sandbox %q: %w", sb.Name, err)
	}
	return HostMemory{Charged: m.Charged, InactiveFile: m.InactiveFile}, nil
}
