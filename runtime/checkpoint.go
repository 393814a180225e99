package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"

	"github.com/flmbox/flmbox/internal/runcmonitor"
	"golang.org/x/sys/unix"
)

// Checkpoint saves the container's whole gVisor sandbox (memory, processes,
// its tmpfs files) into the directory imageDir, with runsc checkpoint. With
// leaveRunning the sandbox goes on running afterwards (runsc's
// --leave-running): a checkpoint that fails then leaves it alive, where
// without it a failed checkpoint kills it. gVisor cannot save a socket bound
// on the host (--host-uds): whatever listens on one must close it first.
func (r *Runtime) Checkpoint(ctx context.Context, c Container, imageDir string, leaveRunning bool) error {
	var actions []runc.CheckpointAction
	if leaveRunning {
		actions = append(actions, runc.LeaveRunning)
	}
	err := r.call(ctx, "checkpoint", func(ctx context.Context) error {
		return r.runc(c, false).Checkpoint(ctx, c.ID, &runc.CheckpointOpts{ImagePath: imageDir}, actions...)
	})
	if err != nil {
		return fmt.Errorf("checkpoint container %s with runsc: %w", c.ID, err)
	}
	return nil
}

// Restore makes the container c again from the checkpoint in imageDir, with
// runsc restore --detach on the bundle directory (its config.json: its
// mounts' host paths may differ from the checkpointed container's, but
// every file the sandbox's kernel still holds from them must exist, and
// the binaries it runs from them must be the same). The container's ID must be
// free. Its stdio is log, as Run gives it. runsc restores it under a raised
// CPU quota and, if its checkpoint allows, the memory limit the sandbox is
// shown; its own limits are set before Restore returns (see bootBundle).
// On failure the error quotes the end of log, and the container is deleted.
// It returns the pid of the container's gVisor sandbox process, as Run does.
func (r *Runtime) Restore(ctx context.Context, c Container, bundle, imageDir string, log *os.File) (int, error) {
	if err := ValidatePlatform(c.Platform); err != nil {
		return 0, err
	}
	dir, after, err := bootBundle(bundle, c.ID, imageDir)
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	unlock, err := r.lockCreate()
	if err != nil {
		return 0, err
	}
	defer unlock()
	pidFile, err := filepath.Abs(filepath.Join(dir, pidFileName))
	if err != nil {
		return 0, err
	}
	err = r.call(ctx, "restore", func(ctx context.Context) error {
		_, err := r.runc(c, true).Restore(ctx, c.ID, dir, &runc.RestoreOpts{
			CheckpointOpts: runc.CheckpointOpts{ImagePath: imageDir}, IO: runcmonitor.FileIO{F: log}, Detach: true, PidFile: pidFile})
		return err
	})
	if err != nil {
		r.cleanUp(ctx, c)
		return 0, fmt.Errorf("restore container %s with runsc: %w%s", c.ID, err, panicOrTail(log.Name()))
	}
	pid, err := readPidFile(pidFile)
	if err != nil {
		err = fmt.Errorf("read runsc's pid file: %w: %w", err, errdefs.ErrUnavailable)
	} else {
		err = after.apply(pid)
	}
	if err != nil {
		r.cleanUp(ctx, c)
		return 0, fmt.Errorf("restore container %s: %w", c.ID, err)
	}
	return pid, nil
}

// readPidFile reads the pid runsc wrote into a --pid-file.
func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Signal sends sig to the container's first process (runsc kill).
func (r *Runtime) Signal(ctx context.Context, c Container, sig unix.Signal) error {
	err := r.call(ctx, "kill", func(ctx context.Context) error {
		return r.runc(c, false).Kill(ctx, c.ID, int(sig), nil)
	})
	if err != nil {
		return fmt.Errorf("signal container %s with runsc: %w", c.ID, err)
	}
	return nil
}

// panicOrTail is what a failed restore's log says: its panic line (a
// damaged image makes the sandbox panic, and the end of its log is the
// middle of a stack dump), else its end.
func panicOrTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "panic: ") {
			return ": " + l
		}
	}
	return logTail(path)
}
