package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox/record"
)

// Remove stops sandbox name and removes everything it holds: its
// processes, its /tmp, its directory and its image lease. Removing a
// sandbox that does not exist is not an error. A sandbox being created or
// removed by another process is waited for until ctx is done; once the
// removal has begun, it is finished whatever ctx says.
func (m *Manager) Remove(ctx context.Context, name string) error { return m.remove(ctx, named(name)) }

func (m *Manager) remove(ctx context.Context, t target) error {
	rec, unlock, err := m.lockToRemove(ctx, t.name, "remove")
	if err != nil || rec == nil {
		return err
	}
	defer unlock()
	if err := t.check(rec); err != nil {
		return err
	}
	return m.destroy(ctx, rec)
}

// lockToRemove takes the lock of sandbox name's directory, waiting for
// another process's work on it, and reads its record: nil if there is no
// such sandbox; a record of the directory alone if it has none, or one that
// cannot be read (said in a warning), which destroy removes as far as it can.
func (m *Manager) lockToRemove(ctx context.Context, name, doing string) (*record.Record, func(), error) {
	dir, err := record.Dir(m.root, name)
	if err != nil {
		return nil, nil, err
	}
	l, err := lock(ctx, dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s sandbox %q: %w", doing, name, err)
	}
	rec, err := record.Read(m.root, name)
	switch {
	case errdefs.IsNotFound(err):
		rec = &record.Record{Name: name, Dir: dir} // a directory without its record: nothing else was made
	case err != nil:
		m.o.warnf("%v: removing its directory; its runsc container and image lease, if any, are left to the next reconcile", err)
		rec = &record.Record{Name: name, Dir: dir}
	}
	return rec, l.Unlock, nil
}

// destroy removes what the sandbox of rec holds, in the reverse order of
// Create: its runsc container, its run directory's mount, its lease, its
// directory. The record says removing until the directory is gone; from
// then on, ctx no longer stops it (a removal half done would leave a
// container no record names). The caller holds the directory's lock.
func (m *Manager) destroy(ctx context.Context, rec *record.Record) error {
	if rec.State != record.Removing && rec.ID != "" {
		rec.State = record.Removing
		if err := record.Write(rec); err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
	}
	// The removal goes on when ctx ends (a Ctrl-C must not leave half a
	// sandbox), for removeGrace more: a runsc that hangs then is cut, and
	// the record stays removing, for the next Reconcile to finish.
	dctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(removeGrace, stop) })()
	ctx = dctx
	if rec.ID != "" {
		rt, err := m.runtime()
		if err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
		if err := rt.Delete(ctx, container(rec)); err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
	}
	if err := unix.Unmount(rec.RunDir(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("remove sandbox %q: unmount its run directory: %w", rec.Name, err)
	}
	if Network(rec.Network) == NetworkEgress {
		if err := removeEgress(rec); err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
	}
	if rec.Manifest != "" {
		store, err := m.Images()
		if err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
		if err := store.Release(ctx, rec.Manifest, leaseHolder(rec)); err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
	}
	if err := os.RemoveAll(rec.Dir); err != nil {
		return fmt.Errorf("remove sandbox %q's files: %w", rec.Name, err)
	}
	m.pruneRunsc()
	return nil
}

// removeGrace is how long a removal goes on once its caller's context
// ended.
const removeGrace = 2 * time.Second

// pruneRunsc removes what runsc leaves in its state directory (its
// null-netns mount, stale files) once no sandbox is left, so that a state
// root without sandboxes can be removed with rm -rf. A sandbox being created
// has its directory from before runsc runs (Create's claim), and runsc's
// creations hold a lock that Prune does not wait for.
func (m *Manager) pruneRunsc() {
	rt, err := m.runtime()
	if err != nil {
		return
	}
	idle := func() bool {
		ents, err := os.ReadDir(stateroot.Sandboxes(m.root))
		return err == nil && len(ents) == 0
	}
	if err := rt.Prune(idle); err != nil {
		m.o.warnf("%v", err)
	}
}

// newDirGrace is how long Reconcile leaves a .new-* directory alone: Create
// makes it, then locks it.
const newDirGrace = time.Minute

// Reconcile removes what killed flmbox processes left: sandboxes whose
// Create or Remove did not finish (their directory's lock is free and their
// record says creating or removing), running sandboxes whose owner is gone
// (Spec.Ephemeral), runsc containers that no record names, and image leases
// whose sandbox does not exist. It costs a directory listing, a read of each
// record (and a lock attempt only for one that may need work), a read of
// /proc per ephemeral one and a listing of runsc's state directory (and a
// scan of /proc only if that names a container no record does: see
// runtime.Runtime.KillOrphans); sandboxes other processes are creating or
// removing are left alone, and so is a directory whose record cannot be
// read (it is reported).
func (m *Manager) Reconcile(ctx context.Context) error {
	if err := m.open(); err != nil {
		return err
	}
	// runsc's containers and the image leases are listed before the records
	// are read: a record is written before its container and its lease
	// exist, so one that no record read afterwards names was left by a
	// killed flmbox, never a sandbox being made.
	var errs []error
	rt, rtErr := m.runtime() // without runsc, no container could be made
	var containers []string
	if rtErr == nil {
		var err error
		if containers, err = rt.List(ctx); err != nil {
			errs = append(errs, fmt.Errorf("reconcile containers: %w", err))
			rtErr = err
		}
	}
	leases, err := m.store.Leases()
	if err != nil {
		return fmt.Errorf("reconcile image leases: %w", err)
	}
	ents, err := os.ReadDir(stateroot.Sandboxes(m.root))
	if err != nil {
		return fmt.Errorf("reconcile sandboxes: %w", err)
	}
	known := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		rec, _, err := m.reconcileDir(ctx, stateroot.Sandbox(m.root, e.Name()))
		if err != nil {
			errs = append(errs, err)
		}
		if rec != nil {
			known[rec.ID] = true
		}
	}
	if rtErr == nil {
		errs = append(errs, m.reconcileContainers(ctx, rt, containers, known))
	}
	errs = append(errs, m.reconcileLeases(ctx, leases, known), m.reconcileEgress(ctx))
	m.pruneRunsc()
	return errors.Join(errs...)
}

// reconcileContainers deletes flmbox's runsc containers that no record
// names (containers, listed before the records in known were read): a
// Create killed while runsc was making its container, after its clean-up
// looked for it.
func (m *Manager) reconcileContainers(ctx context.Context, rt *runtime.Runtime, containers []string, known map[string]bool) error {
	// Processes of a runsc run killed while it made its container may have
	// no state in runsc's root: runsc lists and deletes them not.
	if n, err := rt.KillOrphans(known, m.recordedIDs); err != nil {
		m.o.warnf("reconcile containers: %v", err)
	} else if n > 0 {
		m.o.warnf("killed the runsc processes of %d containers that neither runsc nor any sandbox knows", n)
	}
	var errs []error
	for _, id := range containers {
		if !strings.HasPrefix(id, "flmbox-") || known[id] {
			continue
		}
		m.o.warnf("deleting runsc container %s, which no sandbox names", id)
		if err := rt.Delete(ctx, container(&record.Record{ID: id, Network: "none"})); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// recordedIDs returns the container IDs every record names.
func (m *Manager) recordedIDs() []string {
	var ids []string
	for _, rec := range m.records() {
		ids = append(ids, rec.ID)
	}
	return ids
}

// reconcileLeases releases the image leases (listed before the records in
// known were read) whose sandbox does not exist. A lease is taken after its
// sandbox's record names its container, and released before the record is
// removed; its holder names the container, which no other sandbox has,
// whatever names the sandbox takes (a pool's).
func (m *Manager) reconcileLeases(ctx context.Context, leases []rootfs.Lease, known map[string]bool) error {
	var errs []error
	for _, l := range leases {
		_, id, ok := parseHolder(l.Holder)
		if !ok {
			continue // not a sandbox's lease
		}
		if !known[id] {
			if err := m.store.Release(ctx, l.ManifestDigest, l.Holder); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reconcile image leases: %w", err)
	}
	return nil
}

// reconcileDir removes the sandbox directory dir if a killed Create or
// Remove left it, or if its sandbox is running and its owner is gone, and
// reports whether it is gone; if not, it returns the sandbox's record as it
// read it (nil if it could not). A running sandbox of a live owner (or of
// none) without a checkpoint image left, and a suspended one, need no work:
// their record is read and no lock taken; the others' directory is locked,
// and left alone if another process holds it.
func (m *Manager) reconcileDir(ctx context.Context, dir string) (_ *record.Record, gone bool, _ error) {
	name := filepath.Base(dir)
	if strings.HasPrefix(name, ".new-") {
		// A Create killed before it renamed the directory to the
		// sandbox's name: nothing else was made yet. A new one is left to
		// its Create, which locks it just after making it.
		if fi, err := os.Lstat(dir); err != nil || time.Since(fi.ModTime()) < newDirGrace {
			return nil, err != nil, nil
		}
	} else if rec, err := record.ReadDir(dir); err == nil && !rec.Renamed() && settledOn(rec) {
		return rec, false, nil
	}
	l, err := tryLock(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, true, nil
	}
	if err != nil {
		// Another process is at work on it: its record (a Create's is
		// written before its container) is what it is now.
		rec, _ := record.ReadDir(dir)
		return rec, false, nil
	}
	defer l.Unlock()
	if strings.HasPrefix(name, ".new-") {
		return nil, true, os.RemoveAll(dir)
	}
	rec, err := record.ReadDir(dir)
	switch {
	case errdefs.IsNotFound(err):
		rec = &record.Record{Name: name, Dir: dir} // a directory without its record: nothing else was made
	case err != nil:
		return nil, false, fmt.Errorf("reconcile sandbox %q: %w", name, err)
	case rec.Renamed():
		m.o.warnf("removing sandbox %s, which an interrupted flmbox left renamed from %s (taking it from a pool or giving it back)", name, rec.Name)
	case rec.State == record.Running && !rec.Owner.Gone():
		removeStaleImages(rec)
		if Network(rec.Network) == NetworkEgress {
			return rec, false, m.healEgress(ctx, rec)
		}
		return rec, false, nil
	case rec.State == record.Suspended:
		return rec, false, nil
	case rec.State == record.Suspending, rec.State == record.Resuming:
		return rec, false, m.reconcileSuspend(ctx, rec)
	case rec.State == record.Running:
		m.o.warnf("removing sandbox %s, whose owner flmbox process %d is gone", name, rec.Owner.PID)
	default:
		m.o.warnf("removing sandbox %s, which an interrupted flmbox left %s", name, orUnknown(rec.State))
	}
	if err := m.destroy(ctx, rec); err != nil {
		return rec, false, err
	}
	return nil, true, nil
}

// settledOn says whether the sandbox of rec, read without its lock, needs
// no work of Reconcile: suspended, or running (not egress: its network is
// checked) with its owner alive and no checkpoint image left by a resume.
func settledOn(rec *record.Record) bool {
	if rec.State == record.Suspended {
		return true
	}
	if rec.State != record.Running || rec.Owner.Gone() || Network(rec.Network) == NetworkEgress {
		return false
	}
	for _, d := range []string{checkpointDir, checkpointOld} {
		if _, err := os.Lstat(filepath.Join(rec.Dir, d)); !errors.Is(err, os.ErrNotExist) {
			return false
		}
	}
	return true
}

func orUnknown(s record.State) string {
	if s == "" {
		return "without a record"
	}
	return string(s)
}
