package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/mountinfo"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/sandbox"
)

// runner is one run of the bench. Everything it makes lives under dir, a
// private directory beside the user's state under Options.Root:
//
//	dir/main/        the state root of every sandbox the bench makes (its
//	                 own image cache, sandboxes/, runsc/)
//	dir/cold/N/      state roots of cold prewarms
//	dir/crane/N/     trees of crane export | tar
//	dir/raw/         bundles and runsc root of the raw runsc baselines
//	dir/flame-*/     working directories (and sockets) of flmbox instance
//	                 processes, whose sandboxes are under dir/main
//
// The egress figures also make two network namespaces, bound at
// /run/netns/flmbox-ID-world and -worker, which they remove (benchNet).
//
// close removes every sandbox and container, unmounts what is mounted under
// dir and removes it.
type runner struct {
	opts      Options
	flmboxBin string // the flmbox binary, run as a user would
	runsc     string // its path
	runscInfo *sandbox.Runsc
	python    string // the host's python3, the callback and egress figures' baseline
	nsenter   string // runs the egress figures' processes in their namespace
	dir       string
	root      string           // dir/main
	m         *sandbox.Manager // the sandboxes under root
	progress  io.Writer        // stage lines
	start     time.Time

	image    string         // the image, as given or picked
	ref      string         // the image by index digest, in the loopback registry
	img      *rootfs.Result // the image prewarmed in root
	imageEnv []string       // its config's environment

	rawProcess struct { // runsc exec's process (execProcess), made once
		once sync.Once
		p    *specs.Process
		err  error
	}
}

// newRunner checks what the bench needs and makes its private state root.
func newRunner(ctx context.Context, o Options) (*runner, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	runsc, err := sandbox.LookupRunsc(ctx, o.Runsc)
	if err != nil {
		return nil, err
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		return nil, fmt.Errorf("find python3 on the host, the callback figure's baseline: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, fmt.Errorf("find nsenter, which runs the egress figures in a network namespace: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	image, err := pickImage(ctx, o.Root, o.Image)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(o.Flmbox); err != nil {
		return nil, fmt.Errorf("find the flmbox command to measure: %w", err)
	}
	agent := filepath.Join(filepath.Dir(o.Flmbox), sandbox.AgentName)
	if err := os.MkdirAll(o.Root, 0o700); err != nil {
		return nil, fmt.Errorf("create state root %s: %w", o.Root, err)
	}
	dir, err := os.MkdirTemp(o.Root, "bench-")
	if err != nil {
		return nil, fmt.Errorf("create the bench's directory: %w", err)
	}
	// The mount table names mounts by absolute, resolved paths.
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	r := &runner{opts: o, flmboxBin: o.Flmbox, runsc: runsc.Path, runscInfo: runsc, python: python, nsenter: nsenter, dir: dir, root: filepath.Join(dir, "main"), image: image,
		progress: o.Progress, start: time.Now()}
	if r.progress == nil {
		r.progress = io.Discard
	}
	mopts := []sandbox.Option{sandbox.WithRunsc(runsc.Path), sandbox.WithAgent(agent)}
	if o.Warnf != nil {
		mopts = append(mopts, sandbox.WithWarnf(o.Warnf))
	}
	if r.m, err = sandbox.Open(r.root, mopts...); err == nil {
		_, err = r.m.Agent() // before anything is measured
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

// pickImage returns image, checked, or the only image of the cache under
// root whose source is known (a reference or an OCI layout it was prewarmed
// by).
func pickImage(ctx context.Context, root, image string) (string, error) {
	if image != "" {
		_, err := rootfs.ParseReference(image)
		return image, err
	}
	m, err := sandbox.Open(root)
	if err != nil {
		return "", err
	}
	store, err := m.Images()
	if err != nil {
		return "", err
	}
	imgs, err := store.List(ctx)
	if err != nil {
		return "", err
	}
	if len(imgs) != 1 {
		return "", fmt.Errorf("the image cache under %s holds %d images, not exactly one: %w", root, len(imgs), ErrNoImage)
	}
	for _, n := range imgs[0].Names {
		if !strings.HasPrefix(n, "sha256:") {
			return n, nil
		}
	}
	return "", fmt.Errorf("the cached image %s was prewarmed by digest only, so its source is unknown: %w", imgs[0].ManifestDigest, ErrNoImage)
}

// logf prints a progress line, with the time since the bench started.
func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.progress, "bench: %4.0fs  %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// flmbox returns a command running the flmbox binary on the private root.
func (r *runner) flmbox(ctx context.Context, args ...string) *exec.Cmd {
	return r.flmboxIn(ctx, r.root, args...)
}

// flmboxIn returns a command running the flmbox binary with --root root.
// Cancelling ctx sends it SIGTERM, as a user's ^C would, so that it removes
// what it made; close removes anything left.
func (r *runner) flmboxIn(ctx context.Context, root string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.flmboxBin, append([]string{"--root", root, "--runsc", r.runsc}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

// close removes everything the bench made, even when the bench was
// interrupted: every sandbox and raw runsc container, every mount under its
// directory (sandboxes' run directories, runsc's null-netns), the directory.
func (r *runner) close(ctx context.Context) error {
	r.logf("remove %s", r.dir)
	var errs []error
	// No pool is refilled while its sandboxes are removed.
	_, err := r.m.DrainPools(ctx, sandbox.DrainOptions{})
	errs = append(errs, err)
	// Reconcile removes what an interrupted Create left.
	errs = append(errs, r.m.Reconcile(ctx))
	sbs, err := r.m.List(ctx)
	errs = append(errs, err)
	for _, sb := range sbs {
		errs = append(errs, sb.Remove(ctx))
	}
	errs = append(errs, r.removeRawContainers(ctx))
	// Nothing is removed while something is still mounted below.
	if err := unmountUnder(r.dir); err != nil {
		errs = append(errs, err)
	} else if err := os.RemoveAll(r.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove the bench's directory: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up after the bench (remove %s by hand if it is left): %w", r.dir, err)
	}
	return nil
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	points, err := mountinfo.Under(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range points {
		// A mount may be stacked (runsc's null-netns): unmount until none is left.
		for range 8 {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
				if err != unix.EINVAL && err != unix.ENOENT {
					errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
				}
				break
			}
		}
	}
	return errors.Join(errs...)
}
