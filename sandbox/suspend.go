package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// A suspended sandbox is its checkpoint image, ROOT/sandboxes/NAME/checkpoint
// (runsc checkpoint: its memory, processes and /tmp), its record, its bundle
// and its image lease; no process and no host memory. The image is made in
// checkpoint.tmp and renamed when whole: that rename decides that the
// sandbox is suspended. A resume renames it checkpoint.old and removes it
// in the background (unlinking its pages, tens of MiB in the page cache,
// takes milliseconds that the first call need not wait for; see
// Manager.Wait); the next suspend, or Reconcile, removes what a process
// that ended first left of it.
const (
	checkpointDir = "checkpoint"
	checkpointTmp = "checkpoint.tmp"
	checkpointOld = "checkpoint.old"
)

// Suspend saves sandbox name to disk and stops it: its agent closes its
// listener (gVisor cannot save it), runsc checkpoints the sandbox, leaving
// it running (a failed checkpoint then leaves it alive), then the sandbox
// is deleted. It survives a reboot of the worker: Resume brings it back
// with its /tmp, its processes and its agent's state. A sandbox with calls
// running is refused (errdefs.ErrFailedPrecondition), as are pooled and
// dead ones; suspending a suspended sandbox does nothing. Killed midway,
// the sandbox is left suspended if its image is whole, else running (see
// Reconcile).
func (m *Manager) Suspend(ctx context.Context, name string) error { return m.suspend(ctx, named(name)) }

func (m *Manager) suspend(ctx context.Context, t target) (err error) {
	name := t.name
	defer func() { err = exhausted(ctx, err) }()
	rec, unlock, err := m.lockRecord(ctx, name, "suspend")
	if err != nil {
		return err
	}
	defer unlock()
	if err := t.check(rec); err != nil {
		return err
	}
	if err := m.endStale(ctx, rec); err != nil {
		return fmt.Errorf("suspend sandbox %q: %w", name, err)
	}
	switch {
	case rec.State == record.Suspended:
		return nil
	case rec.State != record.Running:
		return fmt.Errorf("suspend sandbox %q: it is %s: %w", name, rec.State, errdefs.ErrFailedPrecondition)
	case rec.Pooled != nil:
		return fmt.Errorf("suspend sandbox %q: %w", name, record.ErrPooled)
	}
	if err := checkPrivileges(fmt.Sprintf("suspend sandbox %q", name)); err != nil {
		return err
	}
	rt, err := m.runtime()
	if err != nil {
		return fmt.Errorf("suspend sandbox %q: %w", name, err)
	}
	if !rt.Alive(ctx, container(rec)) {
		return fmt.Errorf("suspend sandbox %q: %w", name, record.ErrDead)
	}
	rec.State = record.Suspending
	if err := record.Write(rec); err != nil {
		return err
	}
	back := func(err error) error {
		rec.State = record.Running
		if werr := record.Write(rec); werr != nil {
			m.o.warnf("%v", werr)
		}
		return fmt.Errorf("suspend sandbox %q: %w", name, err)
	}
	res, err := rec.Call(ctx, &wire.Request{Version: wire.ProtocolVersion, Suspend: true})
	switch {
	case err != nil:
		return back(err)
	case res.Error != "":
		return back(fmt.Errorf("%s: %w", res.Error, errdefs.ErrFailedPrecondition))
	case !res.Suspended:
		return back(fmt.Errorf("its agent cannot be suspended: %w", wire.ErrProtocolVersion))
	}
	tmp, img := filepath.Join(rec.Dir, checkpointTmp), filepath.Join(rec.Dir, checkpointDir)
	os.RemoveAll(tmp)
	removeStaleImages(rec)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return back(err)
	}
	if err := rt.Checkpoint(ctx, container(rec), tmp, true); err != nil {
		os.RemoveAll(tmp)
		// Its agent listens again.
		return back(m.runscFailed(ctx, "checkpoint it", consolePath(rec), consolePath(rec), err))
	}
	if err := os.Rename(tmp, img); err != nil {
		os.RemoveAll(tmp)
		return back(err)
	}
	// Suspended from here on: what is left is to stop it.
	return m.finishSuspend(context.WithoutCancel(ctx), rec)
}

// finishSuspend stops the sandbox of rec, whose checkpoint image is whole,
// and records it suspended.
func (m *Manager) finishSuspend(ctx context.Context, rec *record.Record) error {
	rt, err := m.runtime()
	if err != nil {
		return err
	}
	if err := rt.Delete(ctx, container(rec)); err != nil {
		return fmt.Errorf("suspend sandbox %q: %w", rec.Name, err)
	}
	if err := unmountRunDir(rec); err != nil {
		return fmt.Errorf("suspend sandbox %q: %w", rec.Name, err)
	}
	if Network(rec.Network) == NetworkEgress {
		// The network (its namespace, link and table) stays for the
		// restore; the resolver is started again then.
		if err := resolverFiles(rec).Stop(); err != nil {
			return fmt.Errorf("suspend sandbox %q: %w", rec.Name, err)
		}
	}
	rec.State, rec.Process, rec.ImageBytes = record.Suspended, nil, imageBytes(rec)
	return record.Write(rec)
}

// Resume brings suspended sandbox name back from its checkpoint image:
// its /tmp, its processes and its agent, which answers calls again as
// before (each call a new process, as always). Resuming a running sandbox
// does nothing, and reports false. A resume that fails says why, keeps the
// image and leaves the sandbox suspended, recorded so before Resume
// returns; two resumes at once restore it once. An image runsc cannot
// restore fails with ErrCheckpointDamaged (errdefs.ErrDataLoss): no resume
// will bring that sandbox back, it can only be removed. runsc's own words
// about a failure are in ROOT/sandboxes/NAME/console.log, which the error
// names (and WithDebugf's log).
func (m *Manager) Resume(ctx context.Context, name string) (resumed bool, err error) {
	return m.resume(ctx, named(name))
}

func (m *Manager) resume(ctx context.Context, t target) (resumed bool, err error) {
	name := t.name
	defer func() { err = exhausted(ctx, err) }()
	rec, unlock, err := m.lockRecord(ctx, name, "resume")
	if err != nil {
		return false, err
	}
	defer unlock()
	if err := t.check(rec); err != nil {
		return false, err
	}
	if err := m.endStale(ctx, rec); err != nil {
		return false, fmt.Errorf("resume sandbox %q: %w", name, err)
	}
	switch rec.State {
	case record.Running:
		return false, nil
	case record.Suspended:
	default:
		return false, fmt.Errorf("resume sandbox %q: it is %s: %w", name, rec.State, errdefs.ErrFailedPrecondition)
	}
	// What a resume needs is checked before the record changes.
	if err := checkPrivileges(fmt.Sprintf("resume sandbox %q", name)); err != nil {
		return false, err
	}
	if _, err := m.runtime(); err != nil {
		return false, fmt.Errorf("resume sandbox %q (it stays suspended): %w", name, err)
	}
	rec.State = record.Resuming
	if err := record.Write(rec); err != nil {
		return false, err
	}
	if err := m.restore(ctx, rec); err != nil {
		if uerr := m.undoResume(context.WithoutCancel(ctx), rec); uerr != nil {
			m.o.warnf("%v", uerr)
		}
		if errors.Is(err, ErrCheckpointDamaged) {
			return false, err
		}
		return false, fmt.Errorf("resume sandbox %q (it stays suspended, its image kept): %w", name, err)
	}
	rec.State, rec.ImageBytes = record.Running, 0
	if err := record.Write(rec); err != nil {
		return false, err
	}
	rec.Touch()
	m.removeImage(rec)
	return true, nil
}

// removeImage removes the checkpoint image of the running sandbox of rec:
// renamed at once, removed in the background (Wait).
func (m *Manager) removeImage(rec *record.Record) {
	img, old := filepath.Join(rec.Dir, checkpointDir), filepath.Join(rec.Dir, checkpointOld)
	if os.Rename(img, old) != nil { // an older one still being removed
		os.RemoveAll(img)
		return
	}
	if !m.background(func(context.Context) { os.RemoveAll(old) }) {
		os.RemoveAll(old) // the Manager is closed: here and now
	}
}

// removeStaleImages removes what is left of the checkpoint images of the
// running sandbox of rec: one being removed by a process that exited
// first, or one a resume killed after it recorded the sandbox running
// left whole (a new checkpoint could not take its name).
func removeStaleImages(rec *record.Record) {
	os.RemoveAll(filepath.Join(rec.Dir, checkpointOld))
	os.RemoveAll(filepath.Join(rec.Dir, checkpointDir))
}

// restore makes the sandbox of rec again from its image, records its new
// gVisor sandbox process in rec, and waits for its agent.
func (m *Manager) restore(ctx context.Context, rec *record.Record) error {
	rt, err := m.runtime()
	if err != nil {
		return err
	}
	img := filepath.Join(rec.Dir, checkpointDir)
	if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
		return &failure{msg: fmt.Sprintf("restore sandbox %q: %v (%v): %v", rec.Name, ErrCheckpointDamaged, err, errdefs.ErrDataLoss),
			errs: []error{err, ErrCheckpointDamaged}}
	}
	if err := unmountRunDir(rec); err != nil {
		return err
	}
	if err := mountRunDir(rec); err != nil {
		return err
	}
	if err := pointOwnMounts(rec); err != nil {
		return err
	}
	if Network(rec.Network) == NetworkEgress {
		if err := m.resumeEgress(ctx, rec); err != nil {
			return err
		}
	}
	logf, err := os.OpenFile(consolePath(rec), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	pid, err := rt.Restore(ctx, container(rec), rec.Dir, img, logf)
	if err != nil {
		return m.runscFailed(ctx, fmt.Sprintf("restore sandbox %q", rec.Name), consolePath(rec), consolePath(rec), err)
	}
	rec.Process = sandboxProcess(pid)
	return waitForAgent(ctx, rec)
}

// undoResume deletes what a failed or killed resume made of the sandbox of
// rec and records it suspended again, whatever else fails (said in a
// warning): its image is whole, and a container of its ID that could not be
// deleted is deleted by the next restore (runsc restore fails on it, and
// deletes it) or Remove. It fails only if the record cannot be written.
func (m *Manager) undoResume(ctx context.Context, rec *record.Record) error {
	var errs []error
	if rt, err := m.runtime(); err != nil {
		errs = append(errs, err)
	} else if err := rt.Delete(ctx, container(rec)); err != nil {
		errs = append(errs, err)
	}
	if err := unmountRunDir(rec); err != nil {
		errs = append(errs, err)
	}
	if Network(rec.Network) == NetworkEgress {
		errs = append(errs, resolverFiles(rec).Stop())
	}
	rec.State, rec.Process = record.Suspended, nil
	if err := record.Write(rec); err != nil {
		return err
	}
	if err := errors.Join(errs...); err != nil {
		m.o.warnf("sandbox %s is suspended again, but what its resume made may be left: %v", rec.Name, err)
	}
	return nil
}

// endStale ends the suspend or resume that rec says is at work, whose
// directory's lock the caller holds: a flmbox killed or failed at work left
// it (see reconcileSuspend), and the caller goes on with rec's state then.
func (m *Manager) endStale(ctx context.Context, rec *record.Record) error {
	if rec.State != record.Suspending && rec.State != record.Resuming {
		return nil
	}
	return m.reconcileSuspend(context.WithoutCancel(ctx), rec)
}

// pointOwnMounts makes the bundle's mounts of the sandbox's own files (its run
// directory, its files of /etc) name the sandbox's directory now: a pooled
// sandbox may have been renamed since it was made (a restore may bind other
// host paths than the checkpointed sandbox's, not other files).
func pointOwnMounts(rec *record.Record) error {
	p := filepath.Join(rec.Dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("read the sandbox's bundle: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("read the sandbox's bundle: %w", err)
	}
	// The sandbox's directory when it was made: the run directory's parent.
	old := ""
	for _, mt := range spec.Mounts {
		if mt.Destination == agentRunDir {
			old = filepath.Dir(mt.Source)
		}
	}
	changed := false
	for i, mt := range spec.Mounts {
		if rest, ok := strings.CutPrefix(mt.Source, old+"/"); ok && old != "" && old != rec.Dir {
			spec.Mounts[i].Source, changed = filepath.Join(rec.Dir, rest), true
		}
	}
	if !changed {
		return nil
	}
	if b, err = json.MarshalIndent(&spec, "", "  "); err != nil {
		return err
	}
	return atomicfile.WriteFile(p, b, 0o600)
}

// unmountRunDir unmounts and removes the sandbox's run directory, if it is
// there: a suspended sandbox has none (its agent's socket went with it).
func unmountRunDir(rec *record.Record) error {
	if err := unix.Unmount(rec.RunDir(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount sandbox %q's run directory: %w", rec.Name, err)
	}
	if err := os.RemoveAll(rec.RunDir()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// lockRecord takes the lock of sandbox name's directory (waiting for
// another process's work on it) and reads its record.
func (m *Manager) lockRecord(ctx context.Context, name, doing string) (*record.Record, func(), error) {
	dir, err := record.Dir(m.root, name)
	if err != nil {
		return nil, nil, err
	}
	l, err := lock(ctx, dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("no sandbox %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s sandbox %q: %w", doing, name, err)
	}
	rec, err := record.Read(m.root, name)
	if err != nil {
		l.Unlock()
		return nil, nil, err
	}
	return rec, l.Unlock, nil
}

// checkpointBytes is the size of suspended sandbox rec's checkpoint image,
// as its record says (its files' if it does not).
func checkpointBytes(rec *record.Record) int64 {
	if rec.ImageBytes > 0 {
		return rec.ImageBytes
	}
	return imageBytes(rec)
}

// imageBytes is the size of the files of sandbox rec's checkpoint image, 0
// if it has none.
func imageBytes(rec *record.Record) int64 {
	var n int64
	filepath.WalkDir(filepath.Join(rec.Dir, checkpointDir), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// reconcileSuspend ends the suspend or resume of rec that a killed flmbox
// left (the caller holds the lock): a suspend whose image is whole is
// finished, one whose image is not is undone (the agent listens again
// within a minute of the suspend request); a resume is undone, its image
// kept.
func (m *Manager) reconcileSuspend(ctx context.Context, rec *record.Record) error {
	switch rec.State {
	case record.Suspending:
		if _, err := os.Stat(filepath.Join(rec.Dir, checkpointDir)); err == nil {
			m.o.warnf("sandbox %s: finishing its suspend, which an interrupted flmbox left: its image is whole", rec.Name)
			return m.finishSuspend(ctx, rec)
		}
		m.o.warnf("sandbox %s: undoing its suspend, which an interrupted flmbox left before its image was whole: it is running", rec.Name)
		os.RemoveAll(filepath.Join(rec.Dir, checkpointTmp))
		// Its agent waits for a checkpoint that will not come: it is told
		// to listen again, and waited for.
		if rt, err := m.runtime(); err == nil && rt.Signal(ctx, container(rec), wire.AbandonSignal) == nil {
			if err := waitForAgent(ctx, rec); err != nil {
				m.o.warnf("%v", err)
			}
		}
		rec.State = record.Running
		return record.Write(rec)
	case record.Resuming:
		m.o.warnf("sandbox %s: undoing its resume, which an interrupted flmbox left: it is suspended", rec.Name)
		return m.undoResume(ctx, rec)
	}
	return nil
}
