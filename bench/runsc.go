package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/flmbox/flmbox/internal/runcmonitor"
	"github.com/flmbox/flmbox/sandbox"
)

// The raw runsc baselines run bare runsc containers, without flmbox, on the
// same cached rootfs with the spec flmbox gives a sandbox (read-only root,
// /tmp, user, environment, limits, no network) but `sleep infinity` as the
// first process instead of the agent. They have a runsc root of their own.
// runsc runs through go-runc as flmbox's own runtime runs it: each command
// bounded (rawBounds), in a process group of its own that is killed whole
// when its bound passes or the bench is interrupted (runcmonitor).

func (r *runner) rawDir() string    { return filepath.Join(r.dir, "raw") }
func (r *runner) rawBundle() string { return filepath.Join(r.rawDir(), "bundle") }

// rawBounds bounds each runsc command of the baselines, as package runtime
// bounds its own: minutes for those that boot a sandbox, run a snippet or
// move its memory, seconds for the others.
var rawBounds = map[string]time.Duration{
	"create":     2 * time.Minute,
	"start":      time.Minute,
	"exec":       5 * time.Minute, // a long snippet (measureLong) runs for seconds
	"checkpoint": 5 * time.Minute,
	"restore":    3 * time.Minute,
	"delete":     20 * time.Second,
	"list":       10 * time.Second,
}

// rawRunc is go-runc's client for the raw containers' root; every call
// repeats the same global flags, as runsc needs.
func (r *runner) rawRunc() *runc.Runc {
	return &runc.Runc{Command: r.runsc, Root: filepath.Join(r.rawDir(), "runsc"), ExtraArgs: []string{"--network=none"}, Setpgid: true}
}

// sandboxRunc is go-runc's client for runsc commands on sb, with the
// sandbox's own runsc root and global flags.
func (r *runner) sandboxRunc(sb *sandbox.Sandbox) (*runc.Runc, error) {
	runsc, global, err := r.m.Plumbing().RunscArgs(sb)
	if err != nil {
		return nil, err
	}
	return &runc.Runc{Command: runsc, ExtraArgs: global, Setpgid: true}, nil
}

// rawCall runs f, a go-runc call that runs runsc command sub (what names it
// for errors), bounded by rawBounds[sub], and returns its wall time. A
// runsc that fails says so with the end of its stderr: stderr if not nil
// (a command given its own output, runc.IO), else what go-runc captured.
func rawCall(ctx context.Context, what, sub string, stderr *bytes.Buffer, f func(ctx context.Context) error) (time.Duration, error) {
	bound := rawBounds[sub]
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	out, err := runcmonitor.Call(cctx, f)
	d := time.Since(start)
	switch {
	case err == nil:
		return d, nil
	case ctx.Err() != nil:
		return d, fmt.Errorf("%s: %w", what, ctx.Err())
	case cctx.Err() != nil:
		return d, fmt.Errorf("%s did not finish in %s, so it was killed: %w", what, bound, context.DeadlineExceeded)
	case out.Err == nil:
		return d, fmt.Errorf("%s: %w", what, err)
	case stderr != nil:
		return d, commandFailed(what, out.Err, stderr.String())
	}
	return d, commandFailed(what, out.Err, string(out.Stderr))
}

// writeRawBundle writes the raw containers' bundle: the spec of a sandbox
// of the image with flmbox's defaults, but no agent (sandbox.BareSpec).
func (r *runner) writeRawBundle() error {
	spec, err := r.bareSpec()
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

// bareSpec is the raw containers' spec (sandbox.BareSpec).
func (r *runner) bareSpec() (*specs.Spec, error) {
	return r.m.Plumbing().BareSpec(sandbox.Spec{Image: r.image}, r.img.Rootfs, r.imageEnv, "sleep", "infinity")
}

// newRawID returns a runsc container ID. runsc matches IDs by prefix, so
// all have the same length.
func newRawID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "bench-" + hex.EncodeToString(b)
}

// bufIO is a runc.IO that captures stdout and stderr apart.
type bufIO struct{ stdout, stderr *bytes.Buffer }

func (o bufIO) Close() error          { return nil }
func (o bufIO) Stdin() io.WriteCloser { return nil }
func (o bufIO) Stdout() io.ReadCloser { return nil }
func (o bufIO) Stderr() io.ReadCloser { return nil }
func (o bufIO) Set(cmd *exec.Cmd)     { cmd.Stdout, cmd.Stderr = o.stdout, o.stderr }

// rawLog opens container id's log, the stdio of its runsc create or
// restore: the container's first process inherits it, and would hold a
// pipe of ours open.
func (r *runner) rawLog(id string) (*os.File, error) {
	return os.OpenFile(filepath.Join(r.rawDir(), id+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
}

// startRaw runs runsc create and start.
func (r *runner) startRaw(ctx context.Context, id string) error {
	logf, err := r.rawLog(id)
	if err != nil {
		return err
	}
	defer logf.Close()
	rc := r.rawRunc()
	what := "runsc create " + id + " (see " + logf.Name() + ")"
	if _, err := rawCall(ctx, what, "create", nil, func(ctx context.Context) error {
		return rc.Create(ctx, id, r.rawBundle(), &runc.CreateOpts{IO: runcmonitor.FileIO{F: logf}})
	}); err != nil {
		return err
	}
	_, err = rawCall(ctx, "runsc start "+id, "start", nil, func(ctx context.Context) error { return rc.Start(ctx, id) })
	return err
}

// deleteRaw stops and deletes a raw container; one that does not exist is
// not an error.
func (r *runner) deleteRaw(ctx context.Context, id string) error {
	rc := r.rawRunc()
	_, err := rawCall(ctx, "runsc delete "+id, "delete", nil, func(ctx context.Context) error {
		return rc.Delete(ctx, id, &runc.DeleteOpts{Force: true})
	})
	if err != nil && ctx.Err() == nil && (strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found")) {
		return nil
	}
	return err
}

// removeRawContainers deletes every raw container left (after an
// interruption).
func (r *runner) removeRawContainers(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(r.rawDir(), "runsc")); err != nil {
		return nil
	}
	var cs []*runc.Container
	rc := r.rawRunc()
	if _, err := rawCall(ctx, "list raw runsc containers", "list", nil, func(ctx context.Context) (err error) {
		cs, err = rc.List(ctx)
		return err
	}); err != nil {
		return err
	}
	var errs []error
	for _, c := range cs {
		errs = append(errs, r.deleteRaw(ctx, c.ID))
	}
	return errors.Join(errs...)
}

// execProcess is the process runsc exec runs for argv in a raw container
// or a sandbox: the raw containers' first process (a sandbox's snippets'
// user, environment and working directory), running argv.
func (r *runner) execProcess(argv []string) (specs.Process, error) {
	rp := &r.rawProcess
	rp.once.Do(func() {
		spec, err := r.bareSpec()
		if err == nil {
			rp.p = spec.Process
		}
		rp.err = err
	})
	if rp.err != nil {
		return specs.Process{}, rp.err
	}
	p := *rp.p
	p.Args = argv
	return p, nil
}

// runscExec runs argv in container id of rc with runsc exec (go-runc's
// Exec: the process written to a file runsc reads, execProcess) and
// returns its wall time and stdout, and its exit status if it ran and
// failed (the error then quotes its stderr).
func (r *runner) runscExec(ctx context.Context, rc *runc.Runc, id string, argv []string) (time.Duration, string, int, error) {
	p, err := r.execProcess(argv)
	if err != nil {
		return 0, "", 0, err
	}
	var stdout, stderr bytes.Buffer
	code := 0
	d, err := rawCall(ctx, "runsc exec "+id, "exec", &stderr, func(ctx context.Context) error {
		err := rc.Exec(ctx, id, p, &runc.ExecOpts{IO: bufIO{&stdout, &stderr}})
		var ee *runc.ExitError
		if errors.As(err, &ee) {
			code = ee.Status
		}
		return err
	})
	return d, stdout.String(), code, err
}

// checkedExec times runsc exec of argv in container id of rc, a measured
// call, and checks that it printed exactly wantOutput; it returns runsc
// exec's exit status if it failed.
func (r *runner) checkedExec(ctx context.Context, rc *runc.Runc, id string, argv []string) (time.Duration, int, error) {
	d, out, code, err := r.runscExec(ctx, rc, id, argv)
	if err != nil {
		return d, code, err
	}
	return d, 0, checkOutput("runsc exec "+id, out, wantOutput)
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
	if _, _, err := r.checkedExec(ctx, r.rawRunc(), id, pythonSnippet.argv); err != nil {
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
