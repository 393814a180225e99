package app

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"
)

// What a command of the flmbox CLI that lives in a binary of its own
// (flmbox bench, in flmbox-bench) shares with flmbox-core's commands.

// RunCommand runs cmd as the one command of the flmbox CLI on args
// (os.Args), and returns the process's exit code, as Run does for
// flmbox-core's commands: the same global flags, the same words for a
// command line that does not parse and for a failure, the same exit
// statuses, and help that names it flmbox CMD.
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer, cmd *cli.Command) int {
	app := newApp(os.Stdin, stdout, stderr)
	app.Usage, app.Commands = cmd.Usage, []*cli.Command{cmd}
	setUsageErrors(app.Commands)
	return runWith(ctx, app, args, stderr)
}

// Advise adds to err what a person can do about it ("" adds nothing), for
// RunCommand to print on a second line.
func Advise(err error, advice string) error { return advise(err, advice) }

// Warnf prints a warning to the app's error writer, as flmbox: warning:
// TEXT.
func Warnf(c *cli.Context, format string, args ...any) { warnf(c, format, args...) }

// DurationOrZeroFlag is a flag of a duration, 0 or positive, whose default
// is value (0: none), read with c.Duration; a bad value is said as a usage
// error that names the flag and what it wants.
func DurationOrZeroFlag(name string, value time.Duration, usage string) *cli.GenericFlag {
	return durationOrZeroFlag(name, value, usage)
}
