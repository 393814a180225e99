package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/flmbox/flmbox/runtime"
)

// The raw runsc baselines run bare runsc containers, without flmbox, on the
// same cached rootfs with the spec flmbox gives a sandbox (read-only root,
// /tmp, user, environment, limits, no network) but `sleep infinity` as the
// first process instead of the agent. They have a runsc root of their own.

func (b *bench) rawDir() string    { return filepath.Join(b.dir, "raw") }
func (b *bench) rawBundle() string { return filepath.Join(b.rawDir(), "bundle") }

// rawRunsc returns a runsc command on the raw containers' root; every call
// repeats the same global flags, as runsc needs.
func (b *bench) rawRunsc(ctx context.Context, args ...string) *exec.Cmd {
	global := []string{"--root", filepath.Join(b.rawDir(), "runsc"), "--network=none"}
	return exec.CommandContext(ctx, b.runsc, append(global, args...)...)
}

// writeRawBundle writes the raw containers' bundle.
func (b *bench) writeRawBundle() error {
	o, err := sandboxOptionsFrom(b.cli) // flmbox's defaults
	if err != nil {
		return err
	}
	spec, err := runtime.GenerateSpec(
		runtime.WithRootfs(b.img.Rootfs),
		runtime.WithTmp(o.tmpBytes),
		runtime.WithUser(sandboxUID, sandboxGID),
		runtime.WithEnv(sandboxEnv(b.imageEnv, nil)),
		runtime.WithNetwork(runtime.NetworkNone),
		runtime.WithLimits(o.limits),
		runtime.WithArgs("sleep", "infinity"),
	)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(b.rawDir(), "runsc"), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(b.rawBundle(), 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.rawBundle(), "config.json"), data, 0o600)
}

// newRawID returns a runsc container ID. runsc matches IDs by prefix, so
// all have the same length.
func newRawID() string { return "bench-" + randomHex(12) }

// startRaw runs runsc create and start. runsc create gets a log file as its
// stdio: the container's first process inherits it, and would hold a pipe
// of ours open.
func (b *bench) startRaw(ctx context.Context, id string) error {
	logf, err := os.OpenFile(filepath.Join(b.rawDir(), id+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	create := b.rawRunsc(ctx, "create", "--bundle", b.rawBundle(), id)
	create.Stdout, create.Stderr = logf, logf
	if err := create.Run(); err != nil {
		return commandFailed("runsc create "+id, err, "see "+logf.Name())
	}
	if out, err := b.rawRunsc(ctx, "start", id).CombinedOutput(); err != nil {
		return commandFailed("runsc start "+id, err, string(out))
	}
	return nil
}

// deleteRaw stops and deletes a raw container; one that does not exist is
// not an error.
func (b *bench) deleteRaw(ctx context.Context, id string) error {
	out, err := b.rawRunsc(ctx, "delete", "--force", id).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "does not exist") && !strings.Contains(string(out), "not found") {
		return commandFailed("runsc delete "+id, err, string(out))
	}
	return nil
}

// removeRawContainers deletes every raw container left (after an
// interruption).
func (b *bench) removeRawContainers(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(b.rawDir(), "runsc")); err != nil {
		return nil
	}
	out, err := b.rawRunsc(ctx, "list", "--quiet").Output()
	if err != nil {
		return fmt.Errorf("list raw runsc containers: %w", err)
	}
	var errs []error
	for _, id := range strings.Fields(string(out)) {
		errs = append(errs, b.deleteRaw(ctx, id))
	}
	return errors.Join(errs...)
}

// rawAllocation times runsc create + start + exec of the Python snippet
// until its output is back, the baseline of a new sandbox's first result;
// the container is deleted afterwards, untimed.
func (b *bench) rawAllocation(ctx context.Context) (time.Duration, error) {
	id := newRawID()
	defer b.deleteRaw(context.WithoutCancel(ctx), id)
	start := time.Now()
	if err := b.startRaw(ctx, id); err != nil {
		return 0, err
	}
	if _, err := checkedCommand(b.rawRunsc(ctx, append([]string{"exec", id}, pythonSnippet.argv...)...)); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
