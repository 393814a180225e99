package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/sandbox"
)

// exitFlmboxFailed is the exit status when flmbox itself failed, as docker
// and podman use it.
const exitFlmboxFailed = runcmd.ExitFlmboxFailed

// NotifyContext returns a copy of parent that the first SIGINT or SIGTERM
// cancels, with a cause that tells Run which (run exits 130 or 143); later
// signals are caught until stop is called.
func NotifyContext(parent context.Context) (ctx context.Context, stop func()) {
	return runcmd.NotifyContext(parent)
}

// Run runs the flmbox CLI on args (os.Args) and returns the process's exit
// code. A failure is printed as "flmbox: ERROR", and on a second line what
// to do about it when the CLI knows.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runApp(ctx, args, os.Stdin, stdout, stderr)
}

// runApp is Run with stdin (code read from -, run --interactive, run
// --batch -, cp -) read from stdin.
func runApp(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runWith(ctx, newApp(stdin, stdout, stderr), args, stderr)
}

// runWith runs app on args and returns the exit code, printing a failure to
// stderr.
func runWith(ctx context.Context, app *cli.App, args []string, stderr io.Writer) int {
	err := app.RunContext(ctx, runcmd.HoistFlags(app, args))
	if err == nil {
		return 0
	}
	code := exitCode(ctx, err)
	if msg := err.Error(); msg != "" {
		fmt.Fprintf(stderr, "flmbox: %s\n", msg)
	}
	if h := adviseOn(err); h != "" {
		fmt.Fprintf(stderr, "flmbox: %s\n", h)
	}
	return code
}

// exitCode is the exit status of a command that failed with err: what a
// cli.Exit says, the signal's (130, 143) if one cut the command short, else
// exitFlmboxFailed. A program's status in err's chain (runsc's
// *exec.ExitError is an ExitCoder too) is never flmbox's.
func exitCode(ctx context.Context, err error) int {
	code := exitFlmboxFailed
	var ec cli.ExitCoder
	var sig *runcmd.Interrupt
	var child *exec.ExitError // a program's (runsc's) status, not flmbox's
	switch {
	case errors.As(err, &ec) && !errors.As(err, &child):
		code = ec.ExitCode()
	case errors.As(context.Cause(ctx), &sig):
		// A command a signal cut short fails as the signal's status
		// (130, 143), as a shell reports it, saying where it stopped.
		code = runcmd.InterruptStatus(ctx)
	}
	return code
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "flmbox",
		HelpName:  "flmbox",
		Usage:     "run untrusted Python and shell snippets in gVisor sandboxes",
		Reader:    stdin,
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed and turned into exit codes by Run, not by cli.
		ExitErrHandler:       func(*cli.Context, error) {},
		OnUsageError:         usageError,
		HideHelpCommand:      true,
		Action:               unknownTopCommand,
		EnableBashCompletion: false,
		Flags:                tableFlags(runcmd.GlobalFlags),
		Commands: []*cli.Command{
			prewarmCommand(),
			imagesCommand(),
			runCommand(),
			sandboxCommand(),
			poolCommand(),
			cpCommand(),
			doctorCommand(),
			pipcacheCommand(),
			benchCommand(),
			instanceCommand(),
			mcpCommand(),
		},
	}
	setUsageErrors(app.Commands)
	return app
}

// ensureRoot creates the state root and returns it absolute, as
// sandbox.Open makes it (what the command starts in the background is handed
// the same root).
func ensureRoot(c *cli.Context) (string, error) {
	root := c.String("root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", advise(fmt.Errorf("create state root %s: %w", root, err), "choose another with --root or FLMBOX_ROOT")
	}
	return filepath.Abs(root)
}

// openManager opens the sandboxes under the state root.
func openManager(c *cli.Context) (*sandbox.Manager, error) {
	root, err := ensureRoot(c)
	if err != nil {
		return nil, err
	}
	opts := []sandbox.Option{sandbox.WithRunsc(c.String("runsc")),
		sandbox.WithWarnf(func(f string, a ...any) { warnf(c, f, a...) }),
		sandbox.WithRefill(refillInBackground(c, root))}
	if c.Bool("debug") {
		// runsc's own words (panics, urpc failures), which errors name
		// only by their log file.
		opts = append(opts, sandbox.WithDebugf(func(f string, a ...any) { fmt.Fprintf(c.App.ErrWriter, "flmbox: debug: "+f+"\n", a...) }))
	}
	return sandbox.Open(root, opts...)
}

// openStore opens the image cache under the state root as sandboxes use
// it (sandbox.Manager.Images), so that prewarm makes the mount points that
// sandboxes need when it unpacks a tree.
func openStore(c *cli.Context) (*rootfs.Store, error) {
	m, err := openManager(c)
	if err != nil {
		return nil, err
	}
	return m.Images()
}

// openReconciledStore opens the image cache after releasing the leases of
// sandboxes that do not exist (see sandbox.Manager.Reconcile), so that what
// a killed flmbox left does not keep images.
func openReconciledStore(c *cli.Context) (*rootfs.Store, error) {
	m, err := openManager(c)
	if err != nil {
		return nil, err
	}
	if err := m.Reconcile(c.Context); err != nil {
		warnf(c, "%v", err)
	}
	return m.Images()
}

// warnf prints a warning to the app's error writer.
func warnf(c *cli.Context, format string, args ...any) {
	fmt.Fprintf(c.App.ErrWriter, "flmbox: warning: "+format+"\n", args...)
}

// advised is an error with what to do about it, for Run to print.
type advised struct {
	error
	advice string
}

func (a *advised) Unwrap() error { return a.error }

// advise adds to err what a person can do about it ("" adds nothing).
func advise(err error, advice string) error {
	if err == nil || advice == "" {
		return err
	}
	return &advised{err, advice}
}

// adviseOn returns what a person can do about err: the advice its command
// gave, else what the CLI knows of its kind.
func adviseOn(err error) string {
	var a *advised
	switch {
	case errors.As(err, &a):
		return a.advice
	case errors.Is(err, sandbox.ErrNoAgent):
		return "install flmbox, flmbox-core and flmbox-agent in one directory (make build puts them in bin/)"
	case errors.Is(err, sandbox.ErrPip):
		return "add the wheels to the cache first (flmbox pipcache add or flmbox pipcache fetch)"
	}
	return hint(err)
}
