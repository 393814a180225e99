package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/internal/warmcall"
	"github.com/flmbox/flmbox/rootfs"
)

// exitFlmboxFailed is the exit status when flmbox itself failed, as docker
// and podman use it.
const exitFlmboxFailed = warmcall.ExitFlmboxFailed

// DefaultRoot is the default state root.
const DefaultRoot = warmcall.DefaultRoot

// Run runs the flmbox CLI on args (os.Args) and returns the process's exit
// code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	err := app.RunContext(ctx, hoistFlags(app, args))
	if err == nil {
		return 0
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		if msg := err.Error(); msg != "" {
			fmt.Fprintf(stderr, "flmbox: %s\n", msg)
		}
		return ec.ExitCode()
	}
	fmt.Fprintf(stderr, "flmbox: %s\n", err)
	return exitFlmboxFailed
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "flmbox",
		Usage:     "run untrusted Python and shell snippets in gVisor sandboxes",
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed and turned into exit codes by run, not by cli.
		ExitErrHandler:       func(*cli.Context, error) {},
		HideHelpCommand:      true,
		EnableBashCompletion: false,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "root", Value: DefaultRoot, EnvVars: []string{"FLMBOX_ROOT"}, Usage: "state root: image cache and sandboxes"},
			&cli.StringFlag{Name: "runsc", EnvVars: []string{"FLMBOX_RUNSC"}, Usage: "runsc binary (default: runsc on PATH)"},
			&cli.BoolFlag{Name: "debug", EnvVars: []string{"FLMBOX_DEBUG"}, Usage: "print debugging details"},
		},
		Commands: []*cli.Command{
			prewarmCommand(),
			imagesCommand(),
			runCommand(),
			sandboxCommand(),
			doctorCommand(),
			pipcacheCommand(),
			benchCommand(),
		},
	}
}

// openStore opens the image cache under the state root.
func openStore(c *cli.Context) (*rootfs.Store, error) {
	root := c.String("root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create state root %s: %w; choose another with --root or FLMBOX_ROOT", root, err)
	}
	return rootfs.OpenStore(filepath.Join(root, "images"))
}

// warnf prints a warning to the app's error writer.
func warnf(c *cli.Context, format string, args ...any) {
	fmt.Fprintf(c.App.ErrWriter, "flmbox: warning: "+format+"\n", args...)
}
