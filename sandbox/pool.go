package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/sandbox/record"
)

// poolPrefix begins the names of the sandboxes a pool holds: a released
// sandbox takes a new one, so that whoever used it under its old name
// cannot reach it any more.
const poolPrefix = "pool-"

// releaseTimeout bounds the reset (and the preinstalls) of a released
// sandbox.
const releaseTimeout = 2 * time.Minute

// Acquire returns a clean running sandbox made from spec: one adopted from
// the pool of spec's shape if one is idle there, else a new one (Create).
// Adoption is atomic across processes: two Acquires never get the same
// sandbox. A pooled sandbox is reset when it is released, not here, and one
// whose agent does not answer is removed instead of being handed out.
//
// An adopted sandbox takes spec.Name if set (errdefs.ErrAlreadyExists if a
// sandbox has it), else keeps its pool name, and belongs to this process if
// spec.Ephemeral. When Acquire takes the last idle sandbox of a pool, or
// finds none, the pool is refilled in the background (see WithRefill); a
// sandbox released goes back to its pool, so that a pool used one sandbox
// at a time never empties. A sandbox acquired is given back with Release,
// or removed with Remove.
func (m *Manager) Acquire(ctx context.Context, spec Spec) (*Sandbox, error) {
	spec, err := spec.withDefaults(m.root)
	if err != nil {
		return nil, err
	}
	if err := checkPrivileges(createDoing(spec.Name)); err != nil {
		return nil, err
	}
	if spec.Name != "" {
		if err := m.nameFree(ctx, spec.Name); err != nil {
			return nil, err
		}
	}
	sh, err := m.resolveShape(ctx, spec)
	if err != nil {
		return nil, err
	}
	key := sh.key()
	cfg := m.readPool(key)
	rec, last, err := m.adoption(spec).FromPool(ctx, m.root, key)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		if cfg != nil && last {
			m.o.refill(key) // it took the last one
		}
		return m.sandbox(rec), nil
	}
	if cfg != nil && cfg.Size > 0 {
		m.o.refill(key)
	}
	return m.Create(ctx, spec)
}

// poolKey is Plumbing.PoolKey.
func (m *Manager) poolKey(ctx context.Context, spec Spec) (key string, pooled bool, err error) {
	if spec, err = spec.withDefaults(m.root); err != nil {
		return "", false, err
	}
	sh, err := m.resolveShape(ctx, spec)
	if err != nil {
		return "", false, err
	}
	key = sh.key()
	return key, m.readPool(key) != nil, nil
}

// resolveShape is the shape of the sandboxes spec (its defaults filled in)
// makes: the agent is found before anything is pulled, then the image is
// found in the cache (a digest reference needs no registry) or pulled.
func (m *Manager) resolveShape(ctx context.Context, spec Spec) (shape, error) {
	if _, err := m.Agent(); err != nil {
		return shape{}, err
	}
	if err := m.open(); err != nil {
		return shape{}, err
	}
	pull, err := pullOptions(spec)
	if err != nil {
		return shape{}, err
	}
	img, err := m.store.Prewarm(ctx, spec.Image, pull)
	if err != nil {
		return shape{}, err
	}
	return m.shapeOf(spec, img.ManifestDigest)
}

// nameFree fails with errdefs.ErrAlreadyExists if sandbox name exists
// (what a killed flmbox left of one is removed first).
func (m *Manager) nameFree(ctx context.Context, name string) error {
	dir, err := record.Dir(m.root, name)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(dir); err == nil {
		_, gone, err := m.reconcileDir(ctx, dir)
		if err != nil {
			return fmt.Errorf("create sandbox %q: remove what an interrupted flmbox left of it: %w", name, err)
		}
		if !gone {
			return fmt.Errorf("sandbox %q %w", name, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// pooled returns the records of the idle sandboxes of shape key, the most
// recently parked first; all shapes' if key is empty (record.Idle).
func (m *Manager) pooled(key string) []*record.Record { return record.Idle(m.root, key) }

// records reads every sandbox's record, whatever name it holds
// (record.All).
func (m *Manager) records() []*record.Record { return record.All(m.root) }

// adoption is how Acquire adopts an idle pooled sandbox for spec
// (record.Adoption, which the flmbox command's pooled run --image uses
// too): under spec's name if set, owned by this process if
// spec.Ephemeral, with spec's labels; one whose agent does not answer, or
// whose record cannot be written, is removed.
func (m *Manager) adoption(spec Spec) record.Adoption {
	a := record.Adoption{
		Owned:  spec.Ephemeral,
		Labels: spec.Labels,
		Discard: func(ctx context.Context, rec *record.Record) {
			if err := m.destroy(ctx, rec); err != nil {
				m.o.warnf("%v", err)
			}
		},
		Warn: func(err error) { m.o.warnf("%v", err) },
	}
	if spec.Name != "" {
		a.Rename = func(rec *record.Record) error { return m.rename(rec, spec.Name) }
	}
	return a
}

// rename moves the sandbox of rec (whose lock the caller holds: it follows
// the directory) to name; the caller writes the record next. Killed in
// between, the record names its old directory, and Reconcile removes it
// (Record.Renamed).
func (m *Manager) rename(rec *record.Record, name string) error {
	dir, err := record.Dir(m.root, name)
	if err != nil {
		return err
	}
	if rec.Lease == "" {
		rec.Lease = leaseHolder(rec)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, rec.Dir, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("sandbox %q %w", name, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("rename sandbox %q to %q: %w", rec.Name, name, err)
	}
	rec.Name, rec.Dir = name, dir
	return nil
}

// Release gives back sandbox name, acquired (or created) earlier: if the
// pool of its shape holds fewer idle sandboxes than its size, the sandbox
// is taken from its name at once (no call can start under it any more),
// reset as a new sandbox of its image (its preinstalls installed again)
// and parked in the pool under a new name; else, or if it is dead or its
// reset fails, it is removed as Remove does. Releasing a sandbox that does
// not exist is not an error; releasing one idle in its pool removes it. If
// this process is killed during the reset, Reconcile removes the sandbox.
func (m *Manager) Release(ctx context.Context, name string) error { return m.release(ctx, named(name)) }

func (m *Manager) release(ctx context.Context, t target) error {
	name := t.name
	rec, unlock, err := m.lockToRemove(ctx, name, "release")
	if err != nil || rec == nil {
		return err
	}
	defer unlock()
	if err := t.check(rec); err != nil {
		return err
	}
	if rec.Pooled != nil {
		return m.destroy(ctx, rec) // idle in its pool: it is taken out (sandbox rm pool-X)
	}
	defer m.expire(context.WithoutCancel(ctx), rec.Shape)
	cfg := m.readPool(rec.Shape)
	if cfg == nil || rec.State != record.Running || len(m.pooled(rec.Shape)) >= cfg.Size {
		return m.destroy(ctx, rec)
	}
	if err := m.recycle(ctx, rec, cfg); err != nil {
		m.o.warnf("removing sandbox %s instead of pooling it: %v", name, err)
		return m.destroy(ctx, rec)
	}
	return nil
}

// recycle takes the sandbox of rec (locked) from its name, resets it and
// parks it in the pool of cfg.
func (m *Manager) recycle(ctx context.Context, rec *record.Record, cfg *poolConfig) (err error) {
	owner, err := record.Self()
	if err != nil {
		return err
	}
	if err := m.rename(rec, poolPrefix+randomHex(6)); err != nil {
		return err
	}
	rec.Owner, rec.Labels = owner, nil // a killed release leaves it to Reconcile; its holder's words go
	if err := record.Write(rec); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	req, err := Request{Language: Shell, Reset: true}.wire()
	if err != nil {
		return err
	}
	// The reset ends the hand-out: from the moment it holds the agent's
	// lock, a request of the holder's handle is refused (wire.Request.HandOut).
	req.NewHandOut = randomHex(8)
	res, err := rec.Call(ctx, req)
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	if res.Error != "" {
		return fmt.Errorf("reset: %s", res.Error)
	}
	rec.HandOut = req.NewHandOut // written with the record by park
	if err := m.preinstall(ctx, rec, cfg.Shape.Pip); err != nil {
		return err
	}
	return m.park(ctx, rec)
}

// park puts the clean sandbox of rec (locked) idle into the pool of its
// shape, if the pool holds fewer than its size (read again: a drain may
// have set it to 0 meanwhile); else it removes it.
func (m *Manager) park(ctx context.Context, rec *record.Record) error {
	sl, err := lockFile(ctx, m.poolPath(rec.Shape, ".lock"), true)
	if err != nil {
		return err
	}
	defer sl.Unlock()
	if cfg := m.readPool(rec.Shape); cfg == nil || len(m.pooled(rec.Shape)) >= cfg.Size {
		return m.destroy(ctx, rec)
	}
	now := time.Now().UTC()
	rec.Pooled, rec.Owner = &now, nil
	return record.Write(rec)
}
