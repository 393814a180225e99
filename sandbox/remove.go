package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/sandbox/record"
)

// Remove stops sandbox name and removes everything it holds: its
// processes, its /tmp, its directory and its image lease. Removing a
// sandbox that does not exist is not an error. A sandbox being created or
// removed by another process is waited for until ctx is done.
func (m *Manager) Remove(ctx context.Context, name string) error {
	dir, err := record.Dir(m.root, name)
	if err != nil {
		return err
	}
	l, err := lock(ctx, dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove sandbox %q: %w", name, err)
	}
	defer l.unlock()
	rec, err := record.Read(m.root, name)
	if err != nil {
		// Removed while we waited, or damaged: remove what is there;
		// Reconcile releases a lease left without its sandbox.
		rec = &record.Record{Name: name, Dir: dir}
	}
	return m.destroy(ctx, rec)
}

// destroy removes what the sandbox of rec holds, in the reverse order of
// Create: its runsc container, its run directory's mount, its lease, its
// directory. The record says removing until the directory is gone.
// The caller holds the directory's lock.
func (m *Manager) destroy(ctx context.Context, rec *record.Record) error {
	if rec.State != record.Removing && rec.ID != "" {
		rec.State = record.Removing
		if err := record.Write(rec); err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
	}
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
	if rec.Manifest != "" {
		store, err := m.Images()
		if err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
		if err := store.Release(ctx, rec.Manifest, rec.Name); err != nil {
			return fmt.Errorf("remove sandbox %q: %w", rec.Name, err)
		}
	}
	if err := os.RemoveAll(rec.Dir); err != nil {
		return fmt.Errorf("remove sandbox %q's files: %w", rec.Name, err)
	}
	return nil
}

// Reconcile removes what killed flmbox processes left: sandboxes whose
// Create or Remove did not finish (their directory's lock is free and their
// record says creating or removing, or is missing), and image leases whose
// sandbox does not exist. It costs a directory listing and a lock attempt
// per sandbox; sandboxes other processes are creating or removing are left
// alone.
func (m *Manager) Reconcile(ctx context.Context) error {
	if err := m.open(); err != nil {
		return err
	}
	ents, err := os.ReadDir(filepath.Join(m.root, "sandboxes"))
	if err != nil {
		return fmt.Errorf("reconcile sandboxes: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() {
			m.reconcileDir(ctx, filepath.Join(m.root, "sandboxes", e.Name()))
		}
	}
	leases, err := m.store.Leases()
	if err != nil {
		return fmt.Errorf("reconcile image leases: %w", err)
	}
	var errs []error
	for _, l := range leases {
		dir, err := record.Dir(m.root, l.Holder)
		if err != nil {
			continue // not a sandbox's lease
		}
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			// A lease is taken after its sandbox's directory exists, and
			// released before it is removed.
			if err := m.store.Release(ctx, l.ManifestDigest, l.Holder); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// reconcileDir removes the sandbox directory dir if a killed Create or
// Remove left it, and reports whether it is gone.
func (m *Manager) reconcileDir(ctx context.Context, dir string) bool {
	l, err := tryLock(dir)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false // another process is at work on it
	}
	defer l.unlock()
	name := filepath.Base(dir)
	if strings.HasPrefix(name, ".new-") {
		// A Create killed before it renamed the directory to the
		// sandbox's name: nothing else was made yet.
		return os.RemoveAll(dir) == nil
	}
	rec, err := record.Read(m.root, name)
	switch {
	case err != nil:
		rec = &record.Record{Name: name, Dir: dir} // no record, or damaged
	case rec.State == record.Running:
		return false
	}
	m.o.warnf("removing sandbox %s, which an interrupted flmbox left %s", name, orUnknown(rec.State))
	return m.destroy(ctx, rec) == nil
}

func orUnknown(s record.State) string {
	if s == "" {
		return "without a record"
	}
	return string(s)
}
