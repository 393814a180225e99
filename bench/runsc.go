package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

// The raw runsc baselines run bare runsc containers, without flmbox, on the
// same cached rootfs with the spec flmbox gives a sandbox (read-only root,
// /tmp, user, environment, limits, no network) but `sleep infinity` as the
// first process instead of the agent. They have a runsc root of their own.

func (r *runner) rawDir() string    { return filepath.Join(r.dir, "raw") }
func (r *runner) rawBundle() string { return filepath.Join(r.rawDir(), "bundle") }

// rawRunsc returns a runsc command on the raw containers' root; every call
// repeats the same global flags, as runsc needs.
func (r *runner) rawRunsc(ctx context.Context, args ...string) *exec.Cmd {
	global := []string{"--root", filepath.Join(r.rawDir(), "runsc"), "--network=none"}
	return exec.CommandContext(ctx, r.runsc, append(global, args...)...)
}

// writeRawBundle writes the raw containers' bundle: the spec of a sandbox
// of the image with flmbox's defaults, but no agent (sandbox.BareSpec).
func (r *runner) writeRawBundle() error {
	spec, err := sandbox.BareSpec(sandbox.Spec{Image: r.image}, r.img.Rootfs, r.imageEnv, "sleep", "infinity")
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(r.rawDir(), "runsc"), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(r.rawBundle(), 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.rawBundle(), "config.json"), data, 0o600)
}

// newRawID returns a runsc container ID. runsc matches IDs by prefix, so
// all have the same length.
func newRawID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "bench-" + hex.EncodeToString(b)
}

// startRaw runs runsc create and start. runsc create gets a log file as its
// stdio: the container's first process inherits it, and would hold a pipe
// of ours open.
func (r *runner) startRaw(ctx context.Context, id string) error {
	logf, err := os.OpenFile(filepath.Join(r.rawDir(), id+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	create := r.rawRunsc(ctx, "create", "--bundle", r.rawBundle(), id)
	create.Stdout, create.Stderr = logf, logf
	if err := create.Run(); err != nil {
		return commandFailed("runsc create "+id, err, "see "+logf.Name())
	}
	if out, err := r.rawRunsc(ctx, "start", id).CombinedOutput(); err != nil {
		return commandFailed("runsc start "+id, err, string(out))
	}
	return nil
}

// deleteRaw stops and deletes a raw container; one that does not exist is
// not an error.
func (r *runner) deleteRaw(ctx context.Context, id string) error {
	out, err := r.rawRunsc(ctx, "delete", "--force", id).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "does not exist") && !strings.Contains(string(out), "not found") {
		return commandFailed("runsc delete "+id, err, string(out))
	}
	return nil
}

// removeRawContainers deletes every raw container left (after an
// interruption).
func (r *runner) removeRawContainers(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(r.rawDir(), "runsc")); err != nil {
		return nil
	}
	out, err := r.rawRunsc(ctx, "list", "--quiet").Output()
	if err != nil {
		return fmt.Errorf("list raw runsc containers: %w", err)
	}
	var errs []error
	for _, id := range strings.Fields(string(out)) {
		errs = append(errs, r.deleteRaw(ctx, id))
	}
	return errors.Join(errs...)
}

// rawAllocation times runsc create + start + exec of the Python snippet
// until its output is back, the baseline of a new sandbox's first result;
// the container is deleted afterwards, untimed.
func (r *runner) rawAllocation(ctx context.Context) (time.Duration, error) {
	id := newRawID()
	defer r.deleteRaw(context.WithoutCancel(ctx), id)
	start := time.Now()
	if err := r.startRaw(ctx, id); err != nil {
		return 0, err
	}
	if _, err := checkedCommand(r.rawRunsc(ctx, append([]string{"exec", id}, pythonSnippet.argv...)...)); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// native returns argv under chroot on the cached rootfs, as the sandbox's
// user and with its environment: the same command without a sandbox.
func (r *runner) native(ctx context.Context, argv []string) *exec.Cmd {
	uid := fmt.Sprintf("--userspec=%d:%d", sandbox.UID, sandbox.GID)
	cmd := exec.CommandContext(ctx, "chroot", append([]string{uid, r.img.Rootfs}, argv...)...)
	cmd.Env = sandbox.Environment(r.imageEnv, nil)
	return cmd
}
