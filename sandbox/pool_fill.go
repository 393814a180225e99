package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sync/errgroup"

	"github.com/flmbox/flmbox/internal/flock"
	"github.com/flmbox/flmbox/internal/procmem"
	"github.com/flmbox/flmbox/sandbox/record"
)

// WithRefill sets how a pool is refilled when an Acquire leaves it below
// its size: refill is called with the pool's shape and must return at once,
// having started something that calls Plumbing.Refill(ctx, shape) — a
// detached process, for a caller that exits soon after (the flmbox command
// runs flmbox pool refill SHAPE). Default: a goroutine of this process,
// which is lost if the process exits first (the next Acquire starts
// another).
func WithRefill(refill func(shape string)) Option { return func(o *options) { o.refiller = refill } }

// refill starts a refill of the pool of shape key.
func (o *options) refill(key string) {
	if o.refiller != nil {
		o.refiller(key)
	}
}

// refillPool makes new sandboxes for the pool of shape until it holds its
// size, unless another refill of that pool is at work (then it returns nil
// at once: at most one refill per pool at a time). The sandboxes are made
// two at a time and belong to this process until they are parked, so that a
// refill killed midway leaves nothing to anyone but Reconcile.
func (m *Manager) refillPool(ctx context.Context, shape string) error {
	if err := m.open(); err != nil {
		return err
	}
	l, err := lockFile(ctx, m.poolPath(shape, ".refill"), false)
	if errors.Is(err, errLocked) {
		return nil
	}
	if err != nil {
		return err
	}
	defer l.Unlock()
	err = m.fill(ctx, shape, 2, true)
	m.noteRefill(shape, err)
	return err
}

// noteRefill keeps the failure of a pool's last refill for Pools
// (ROOT/pool/SHAPE.err), or forgets it after a success: a refill runs in
// the background, where nobody reads its errors.
func (m *Manager) noteRefill(key string, err error) {
	p := m.poolPath(key, ".err")
	if err == nil {
		os.Remove(p)
		return
	}
	os.WriteFile(p, []byte(time.Now().UTC().Format(time.RFC3339)+" "+err.Error()), 0o600)
}

// FillPool sets the size and idle timeout of the pool of spec's shape (kept
// until the pool is drained) and makes sandboxes, o.Parallel at a time,
// until the pool holds o.Size idle ones; it waits for a refill of that pool
// at work first. It returns the pool.
func (m *Manager) FillPool(ctx context.Context, spec Spec, o PoolOptions) (*Pool, error) {
	if err := checkPoolOptions(o); err != nil {
		return nil, err
	}
	if spec.Name != "" {
		return nil, fmt.Errorf("fill pool: the sandboxes of a pool are named by flmbox, not %q: %w", spec.Name, errdefs.ErrInvalidArgument)
	}
	spec, err := spec.withDefaults(m.root)
	if err != nil {
		return nil, err
	}
	if err := checkPrivileges("fill pool"); err != nil {
		return nil, err
	}
	sh, err := m.resolveShape(ctx, spec)
	if err != nil {
		return nil, err
	}
	key := sh.key()
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if err := m.writePool(key, &poolConfig{Image: spec.Image, Shape: sh, Size: o.Size, IdleTimeout: o.IdleTimeout}); err != nil {
		return nil, err
	}
	l, err := lockFile(ctx, m.poolPath(key, ".refill"), true)
	if err != nil {
		return nil, err
	}
	parallel := o.Parallel
	if parallel <= 0 {
		parallel = goruntime.NumCPU()
	}
	m.expire(ctx, key)
	err = m.fill(ctx, key, parallel, false)
	m.noteRefill(key, err)
	l.Unlock()
	if err != nil {
		return nil, err
	}
	return m.pool(ctx, key, m.readPool(key), m.pooled(key), false), nil
}

// fill makes sandboxes for the pool of shape key until it holds its size
// (as read before each round: a drain ends it), parallel at a time; with
// returning, the sandboxes that ephemeral users hold count as held (see
// returning). The caller holds the pool's refill lock.
func (m *Manager) fill(ctx context.Context, key string, parallel int, returning bool) error {
	for {
		cfg := m.readPool(key)
		if cfg == nil {
			return nil
		}
		need := cfg.Size - len(m.pooled(key))
		if returning {
			need -= m.returning(key)
		}
		if need <= 0 {
			return nil
		}
		spec := cfg.Shape.spec(cfg.Image)
		spec.Ephemeral = true // until parked
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(parallel)
		for range need {
			g.Go(func() error { return m.makePooled(gctx, spec, key) })
		}
		if err := g.Wait(); err != nil {
			return fmt.Errorf("fill pool %s: %w", key, err)
		}
	}
}

// returning counts the sandboxes of shape key that ephemeral users hold
// (run --image, batches, Flame sessions): each comes back to the pool when
// it is released, so that a refill making one for it would make one too
// many, removed when the second of the two is parked.
func (m *Manager) returning(key string) int {
	n := 0
	for _, rec := range m.records() {
		if rec.Shape == key && rec.Pooled == nil && rec.State == record.Running && rec.Owner != nil && !rec.Owner.Gone() {
			n++
		}
	}
	return n
}

// makePooled makes a sandbox of spec and parks it in the pool of shape key.
func (m *Manager) makePooled(ctx context.Context, spec Spec, key string) error {
	spec.Name, spec.Labels = poolPrefix+randomHex(6), nil // an idle sandbox is nobody's: its holder labels it
	sb, err := m.Create(ctx, spec)
	if err != nil {
		return err
	}
	l, err := lock(ctx, sb.Bundle)
	if err != nil {
		return errors.Join(err, m.Remove(context.WithoutCancel(ctx), sb.Name))
	}
	defer l.Unlock()
	rec, err := record.Read(m.root, sb.Name)
	if err != nil {
		return err
	}
	if rec.Shape != key {
		// The image's reference now names another manifest than the one
		// the pool was filled with, or flmbox's agent was replaced.
		return errors.Join(fmt.Errorf("pool %s: the sandboxes %s makes now are of another shape (its reference names another manifest, now %s, or flmbox was upgraded): %w",
			key, spec.Image, rec.Manifest, errdefs.ErrFailedPrecondition), m.destroy(ctx, rec))
	}
	return m.park(ctx, rec)
}

// expire removes the idle sandboxes of the pool of shape key (of every
// pool if key is empty) that have been idle for longer than its idle
// timeout, and returns their names.
func (m *Manager) expire(ctx context.Context, key string) []string {
	var gone []string
	for _, rec := range m.pooled(key) {
		timeout := DefaultIdleTimeout
		if cfg := m.readPool(rec.Shape); cfg != nil {
			timeout = cfg.IdleTimeout
		}
		if time.Since(*rec.Pooled) < timeout {
			continue
		}
		if m.removeIdle(ctx, rec, false, func(r *record.Record) bool { return time.Since(*r.Pooled) >= timeout }) {
			gone = append(gone, rec.Name)
		}
	}
	return gone
}

// removeIdle removes the sandbox of rec if, under its lock, it is still
// idle in its pool and ok says so; it reports whether it removed it. If
// wait, it waits for the lock (an adoption at work: the adopter takes the
// sandbox, or leaves it idle for this removal), else it leaves a locked
// sandbox alone.
func (m *Manager) removeIdle(ctx context.Context, rec *record.Record, wait bool, ok func(*record.Record) bool) bool {
	var l *flock.Lock
	var err error
	if wait {
		l, err = lock(ctx, rec.Dir)
	} else {
		l, err = tryLock(rec.Dir)
	}
	if err != nil {
		return false // being adopted, or gone
	}
	defer l.Unlock()
	rec, err = record.ReadDir(rec.Dir)
	if err != nil || rec.Pooled == nil || rec.Renamed() || !ok(rec) {
		return false
	}
	if err := m.destroy(ctx, rec); err != nil {
		m.o.warnf("%v", err)
		return false
	}
	return true
}

// Pool describes the pool of one shape.
type Pool struct {
	// Shape names the shape: what its sandboxes are made of, as Spec says.
	Shape string
	Spec  Spec
	// Manifest is the digest of the image its sandboxes run.
	Manifest    string
	Size        int
	IdleTimeout time.Duration
	// Idle are its idle sandboxes, the most recently parked first.
	Idle []*Sandbox
	// OldestIdle is when its oldest idle sandbox was parked (zero if none).
	OldestIdle time.Time
	// Refilling says that a refill of the pool is at work; RefillError is
	// when and why its last refill failed, if it did.
	Refilling   bool
	RefillError string
	// MemoryKiB is the host memory (PSS) of its idle sandboxes' processes,
	// if measured.
	MemoryKiB int64
}

// PoolsOptions say what Pools measures.
type PoolsOptions struct {
	// Memory measures the host memory of each pool's idle sandboxes
	// (Pool.MemoryKiB): a read of their processes' smaps.
	Memory bool
}

// Pools describes every pool: those with a size and those with idle
// sandboxes, after removing the expired ones.
func (m *Manager) Pools(ctx context.Context, o PoolsOptions) ([]*Pool, error) {
	memory := o.Memory
	if err := m.open(); err != nil {
		return nil, err
	}
	m.expire(ctx, "")
	byKey := map[string][]*record.Record{}
	for _, k := range m.poolKeys() {
		byKey[k] = nil
	}
	for _, rec := range m.pooled("") {
		byKey[rec.Shape] = append(byKey[rec.Shape], rec)
	}
	var out []*Pool
	for k, recs := range byKey {
		out = append(out, m.pool(ctx, k, m.readPool(k), recs, memory))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Image+out[i].Shape < out[j].Spec.Image+out[j].Shape })
	return out, nil
}

// pool describes the pool of shape key.
func (m *Manager) pool(ctx context.Context, key string, cfg *poolConfig, idle []*record.Record, memory bool) *Pool {
	p := &Pool{Shape: key}
	if cfg != nil {
		p.Spec, p.Manifest, p.Size, p.IdleTimeout = cfg.Shape.spec(cfg.Image), cfg.Shape.Manifest, cfg.Size, cfg.IdleTimeout
	}
	for _, rec := range idle {
		if cfg == nil && p.Manifest == "" {
			p.Spec = Spec{Image: rec.Image, Network: Network(rec.Network), Platform: rec.Platform, Limits: Limits(rec.Limits)}
			p.Manifest, p.IdleTimeout = rec.Manifest, DefaultIdleTimeout
		}
		p.Idle = append(p.Idle, m.sandbox(rec))
		p.OldestIdle = *rec.Pooled
		if memory {
			if pids, err := procmem.Container(rec.ID); err == nil {
				if mem, err := procmem.Of(pids); err == nil {
					p.MemoryKiB += mem.PSS
				}
			}
		}
	}
	if b, err := os.ReadFile(m.poolPath(key, ".err")); err == nil {
		p.RefillError = string(b)
	}
	if l, err := lockFile(ctx, m.poolPath(key, ".refill"), false); err == nil {
		l.Unlock()
	} else {
		p.Refilling = errors.Is(err, errLocked)
	}
	return p
}

// DrainOptions select what DrainPools removes.
type DrainOptions struct {
	// Image selects the pools of this image, as given to FillPool or its
	// manifest digest; empty: every pool.
	Image string
	// Shape selects the pool of this shape only (Pool.Shape, PoolKey): one
	// pool of an image whose other shapes (memory, CPUs, network, pip
	// requirements) stay; empty: any shape.
	Shape string
	// Expired removes only the idle sandboxes past their pool's idle
	// timeout, and keeps the pools' sizes.
	Expired bool
}

// DrainPools removes the idle sandboxes of the pools o selects and, unless
// o.Expired, forgets their sizes (nothing refills them; a refill at work
// is waited for) and returns the names of the sandboxes removed. Sandboxes
// in use are left alone, and one being adopted meanwhile goes to its
// adopter.
func (m *Manager) DrainPools(ctx context.Context, o DrainOptions) ([]string, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	if o.Expired {
		return m.expire(ctx, ""), nil
	}
	match := func(image, manifest, shape string) bool {
		return (o.Image == "" || o.Image == image || o.Image == manifest) && (o.Shape == "" || o.Shape == shape)
	}
	var errs []error
	for _, k := range m.poolKeys() {
		cfg := m.readPool(k)
		if cfg != nil && !match(cfg.Image, cfg.Shape.Manifest, k) || cfg == nil && o.Shape != "" && o.Shape != k {
			continue
		}
		// Under the pool's lock: a release parks its sandbox before (the
		// idle ones are removed below) or sees no size after.
		sl, err := lockFile(ctx, m.poolPath(k, ".lock"), true)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = os.Remove(m.poolPath(k, ".json"))
		sl.Unlock()
		if err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("drain pool %s: %w", k, err))
			continue
		}
		// A refill at work parks nothing once the size is gone: wait for it.
		if l, err := lockFile(ctx, m.poolPath(k, ".refill"), true); err != nil {
			errs = append(errs, err)
		} else {
			l.Unlock()
		}
	}
	var gone []string
	for _, rec := range m.pooled("") {
		// An adoption at work is waited for: one that fails leaves the
		// sandbox idle in a pool that no longer has a size.
		if match(rec.Image, rec.Manifest, rec.Shape) && m.removeIdle(ctx, rec, true, func(*record.Record) bool { return true }) {
			gone = append(gone, rec.Name)
		}
	}
	return gone, errors.Join(errs...)
}
