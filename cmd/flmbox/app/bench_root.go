package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/mountinfo"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
)

// bench is one run of `flmbox bench`. Everything it makes lives under dir,
// a private directory beside the user's state under --root:
//
//	dir/main/        the state root of every sandbox the bench makes (its
//	                 own image cache, sandboxes/, runsc/)
//	dir/cold/N/      state roots of cold prewarms
//	dir/crane/N/     trees of crane export | tar
//	dir/raw/         bundles and runsc root of the raw runsc baselines
//
// close removes every sandbox and container, unmounts what is mounted under
// dir and removes it.
type bench struct {
	opts     benchOptions
	self     string // the flmbox binary, run as a user would
	runsc    string
	dir      string
	root     string       // dir/main
	cli      *cli.Context // a CLI context whose --root is root
	progress io.Writer    // stage lines; io.Discard with --json
	start    time.Time

	image    string         // IMAGE, as given or picked
	ref      string         // the image by index digest, in the loopback registry
	img      *rootfs.Result // the image prewarmed in root
	imageEnv []string       // its config's environment
}

// newBench checks what the bench needs and makes its private state root.
func newBench(c *cli.Context, o benchOptions) (*bench, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("flmbox bench runs sandboxes and chroot: run it as root")
	}
	image, err := benchImage(c, o.image)
	if err != nil {
		return nil, err
	}
	runsc, err := runtime.FindRunsc(c.String("runsc"))
	if err != nil {
		return nil, err
	}
	self, err := userBinary()
	if err != nil {
		return nil, err
	}
	userRoot := c.String("root")
	if err := os.MkdirAll(userRoot, 0o700); err != nil {
		return nil, fmt.Errorf("create state root %s: %w; choose another with --root or FLMBOX_ROOT", userRoot, err)
	}
	dir, err := os.MkdirTemp(userRoot, "bench-")
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
	b := &bench{opts: o, self: self, runsc: runsc, dir: dir, root: filepath.Join(dir, "main"), image: image, progress: c.App.ErrWriter, start: time.Now()}
	if o.json {
		b.progress = io.Discard
	}
	if b.cli, err = benchContext(c, "--root", b.root, "--runsc", runsc); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

// benchImage returns IMAGE, or the only image of the user's cache whose
// source is known (a tag or an OCI layout it was prewarmed by).
func benchImage(c *cli.Context, image string) (string, error) {
	if image != "" {
		_, err := rootfs.ParseReference(image)
		return image, err
	}
	store, err := openStore(c)
	if err != nil {
		return "", err
	}
	imgs, err := store.List(c.Context)
	if err != nil {
		return "", err
	}
	if len(imgs) != 1 {
		return "", fmt.Errorf("the image cache under %s holds %d images, not exactly one: name the image to measure with --image IMAGE (flmbox images ls lists them)", c.String("root"), len(imgs))
	}
	for _, n := range imgs[0].Names {
		if !strings.HasPrefix(n, "sha256:") {
			return n, nil
		}
	}
	return "", fmt.Errorf("the cached image %s was prewarmed by digest only, so its source is unknown: name it with --image IMAGE", imgs[0].ManifestDigest)
}

// benchContext returns a CLI context that holds --root, --runsc and the run
// command's flags, set from args: the bench calls the CLI's own functions
// (createSandbox, runBatch) on its private state root through it.
func benchContext(c *cli.Context, args ...string) (*cli.Context, error) {
	set := flag.NewFlagSet("bench", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	flags := append([]cli.Flag{&cli.StringFlag{Name: "root"}, &cli.StringFlag{Name: "runsc"}}, runCommand().Flags...)
	for _, f := range flags {
		if err := f.Apply(set); err != nil {
			return nil, err
		}
	}
	if err := set.Parse(args); err != nil {
		return nil, fmt.Errorf("bench: flags %q: %w", args, err)
	}
	bc := cli.NewContext(c.App, set, nil)
	bc.Context = c.Context
	return bc, nil
}

// logf prints a progress line, with the time since the bench started.
func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: %4.0fs  %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// flmbox returns a command running this flmbox binary on the private root.
func (b *bench) flmbox(ctx context.Context, args ...string) *exec.Cmd {
	return b.flmboxIn(ctx, b.root, args...)
}

// flmboxIn returns a command running this flmbox binary with --root root.
// Cancelling ctx sends it SIGTERM, as a user's ^C would, so that it removes
// what it made; close removes anything left.
func (b *bench) flmboxIn(ctx context.Context, root string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, b.self, append([]string{"--root", root, "--runsc", b.runsc}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

// timeCommand runs cmd and returns its wall time and stdout. A failure
// (including a non-zero exit) is an error that quotes its stderr.
func timeCommand(cmd *exec.Cmd) (time.Duration, []byte, error) {
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return d, nil, commandFailed(commandLine(cmd), err, stderr.String())
	}
	return d, []byte(stdout.String()), nil
}

// checkedCommand times cmd, a measured call, and checks that it printed
// exactly benchWant.
func checkedCommand(cmd *exec.Cmd) (time.Duration, error) {
	d, out, err := timeCommand(cmd)
	if err != nil {
		return d, err
	}
	return d, checkOutput(commandLine(cmd), string(out), benchWant)
}

// timeToOutput runs cmd and returns the time until want has appeared on its
// stdout, which must then be exactly want when cmd exits successfully.
func timeToOutput(cmd *exec.Cmd, want string) (time.Duration, error) {
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	var got []byte
	var d time.Duration
	chunk := make([]byte, 4096)
	for d == 0 {
		n, rerr := out.Read(chunk)
		got = append(got, chunk[:n]...)
		if strings.Contains(string(got), want) {
			d = time.Since(start)
		}
		if rerr != nil {
			break
		}
	}
	rest, _ := io.ReadAll(out)
	got = append(got, rest...)
	if err := cmd.Wait(); err != nil {
		return 0, commandFailed(commandLine(cmd), err, stderr.String())
	}
	return d, checkOutput(commandLine(cmd), string(got), want)
}

// commandFailed describes a command that failed, with the end of its
// stderr. An *exec.ExitError is described, not wrapped: its ExitCode method
// would make the CLI exit with the failed command's status as flmbox's own
// (it satisfies cli.ExitCoder).
func commandFailed(what string, err error, stderr string) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("%s: %s: %s", what, ee.String(), lastLines(stderr, 5))
	}
	return fmt.Errorf("%s: %w: %s", what, err, lastLines(stderr, 5))
}

// checkOutput fails unless a measured call printed exactly want.
func checkOutput(what, got, want string) error {
	if got != want {
		return fmt.Errorf("check the output of %s: got %q, want %q", what, got, want)
	}
	return nil
}

func commandLine(cmd *exec.Cmd) string {
	args := cmd.Args
	if len(args) > 8 {
		args = append(slices.Clip(args[:8]), "…")
	}
	return strings.Join(args, " ")
}

// close removes everything the bench made, even when the bench was
// interrupted: every sandbox and raw runsc container, every mount under its
// directory (sandboxes' run directories, runsc's null-netns), the directory.
func (b *bench) close(ctx context.Context) error {
	b.logf("remove %s", b.dir)
	var errs []error
	if rt, err := runtime.NewRuntime(b.runsc, b.root); err == nil {
		sbs, _ := rt.List()
		for _, sb := range sbs {
			errs = append(errs, removeSandbox(ctx, b.cli, sb.Name))
		}
	}
	errs = append(errs, b.removeRawContainers(ctx))
	// Nothing is removed while something is still mounted below.
	if err := unmountUnder(b.dir); err != nil {
		errs = append(errs, err)
	} else if err := os.RemoveAll(b.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove the bench's directory: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up after the bench (remove %s by hand if it is left): %w", b.dir, err)
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

// userBinary returns the flmbox command that users run: flmbox next to this
// flmbox-core (flmbox makes warm calls itself and execs flmbox-core for the
// rest), or this binary if it is not flmbox-core.
func userBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the flmbox binary to measure: %w", err)
	}
	if filepath.Base(self) != "flmbox-core" {
		return self, nil
	}
	front := filepath.Join(filepath.Dir(self), "flmbox")
	if _, err := os.Stat(front); err != nil {
		return "", fmt.Errorf("find the flmbox command next to %s: %w; install both (make build)", self, err)
	}
	return front, nil
}
