package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	runc "github.com/containerd/go-runc"

	"github.com/flmbox/flmbox/internal/procmem"
	"github.com/flmbox/flmbox/internal/runcmonitor"
)

// suspendTmpBytes is what the suspended sandbox holds in /tmp.
const suspendTmpBytes = 20 << 20

// fillTmp is a snippet that writes suspendTmpBytes random bytes to /tmp.
var fillTmp = fmt.Sprintf("head -c %d /dev/urandom > /tmp/fill", suspendTmpBytes)

// measureSuspend times, in Pairs rounds after one that is not measured, a
// whole `flmbox sandbox suspend` of a sandbox with 20 MiB in /tmp and the
// `flmbox run --sandbox` that resumes it until its first result, side by
// side with runsc checkpoint of a bare container with the same /tmp and its
// runsc restore + exec until the same snippet's output, and with a new
// sandbox's first result (`flmbox run --image`) in the same rounds; it
// checks that a suspended sandbox has no process left.
func (r *runner) measureSuspend(ctx context.Context) (Suspend, error) {
	rep := Suspend{TmpBytes: suspendTmpBytes}
	r.logf("suspend: a sandbox with 20 MiB in /tmp, and runsc checkpoint/restore of a bare container")
	sb, err := r.m.Create(ctx, r.spec("bench-suspend"))
	if err != nil {
		return rep, err
	}
	defer sb.Remove(context.WithoutCancel(ctx))
	if _, err := timed(r.flmbox(ctx, "run", "--sandbox", sb.Name, "--language", "shell", "-c", fillTmp)); err != nil {
		return rep, err
	}
	if err := r.writeRawBundle(); err != nil {
		return rep, err
	}
	var suspend, resume, ckpt, restore, fresh []float64
	for i := -1; i < r.opts.Pairs; i++ {
		ds, err := timed(r.flmbox(ctx, "sandbox", "suspend", sb.Name))
		if err != nil {
			return rep, err
		}
		pids, err := procmem.Container(sb.ID)
		if err != nil {
			return rep, err
		}
		rep.SuspendedProcesses = max(rep.SuspendedProcesses, len(pids))
		if got, err := r.m.Get(ctx, sb.Name); err == nil {
			rep.ImageBytes = got.ImageBytes
		}
		dr, err := timeToOutput(r.flmbox(ctx, "run", "--sandbox", sb.Name, "-c", pythonSnippet.code), wantOutput)
		if err != nil {
			return rep, err
		}
		dc, drr, err := r.rawCheckpointRestore(ctx)
		if err != nil {
			return rep, err
		}
		df, err := r.freshCLI(ctx)
		if err != nil {
			return rep, err
		}
		if i >= 0 {
			suspend, resume, ckpt, restore = append(suspend, ms(ds)), append(resume, ms(dr)), append(ckpt, ms(dc)), append(restore, ms(drr))
			fresh = append(fresh, ms(df))
		}
	}
	rep.SuspendMS, rep.ResumeFirstResultMS = summarize(suspend), summarize(resume)
	rep.RawCheckpointMS, rep.RawRestoreFirstResultMS = summarize(ckpt), summarize(restore)
	rep.FreshFirstResultMS = summarize(fresh)
	return rep, nil
}

// rawCheckpointRestore starts a bare container, fills its /tmp, then
// times runsc checkpoint, and runsc restore + exec of the Python snippet
// until its output (after an untimed runsc delete of the checkpointed
// container, which restore needs).
func (r *runner) rawCheckpointRestore(ctx context.Context) (ckpt, restore time.Duration, err error) {
	id := newRawID()
	defer r.deleteRaw(context.WithoutCancel(ctx), id)
	if err := r.startRaw(ctx, id); err != nil {
		return 0, 0, err
	}
	rc := r.rawRunc()
	if _, _, _, err := r.runscExec(ctx, rc, id, []string{"/bin/sh", "-c", fillTmp}); err != nil {
		return 0, 0, err
	}
	img := filepath.Join(r.rawDir(), id+".img")
	defer os.RemoveAll(img)
	if ckpt, err = rawCall(ctx, "runsc checkpoint "+id, "checkpoint", nil, func(ctx context.Context) error {
		return rc.Checkpoint(ctx, id, &runc.CheckpointOpts{ImagePath: img})
	}); err != nil {
		return 0, 0, err
	}
	if err := r.deleteRaw(ctx, id); err != nil {
		return 0, 0, err
	}
	logf, err := r.rawLog(id)
	if err != nil {
		return 0, 0, err
	}
	defer logf.Close()
	start := time.Now()
	what := "runsc restore " + id + " (see " + logf.Name() + ")"
	if _, err := rawCall(ctx, what, "restore", nil, func(ctx context.Context) error {
		_, err := rc.Restore(ctx, id, r.rawBundle(), &runc.RestoreOpts{CheckpointOpts: runc.CheckpointOpts{ImagePath: img}, IO: runcmonitor.FileIO{F: logf}, Detach: true})
		return err
	}); err != nil {
		return 0, 0, err
	}
	if _, _, err := r.checkedExec(ctx, rc, id, pythonSnippet.argv); err != nil {
		return 0, 0, err
	}
	return ckpt, time.Since(start), nil
}
