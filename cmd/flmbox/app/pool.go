package app

import (
	"context"
	"os"
	"os/exec"
	"syscall"

	"github.com/urfave/cli/v2"
)

func poolCommand() *cli.Command {
	return &cli.Command{
		Name: "pool",
		Usage: "keep clean sandboxes running, per shape (image and sandbox flags), for run --image, run --batch --image, " +
			"sandbox create and flmbox instance sessions to take at once",
		Subcommands: []*cli.Command{poolFillCommand(), poolLsCommand(), poolDrainCommand(), poolRefillCommand(), poolReturnCommand()},
	}
}

// refillInBackground returns a sandbox.WithRefill function that starts
// `flmbox pool refill SHAPE` as a detached process (a session of its own,
// no stdio): the command that took the pool's sandbox exits without
// waiting for it. Errors of the refill are shown by pool ls.
func refillInBackground(c *cli.Context, root string) func(shape string) {
	return func(shape string) {
		self, err := os.Executable()
		if err != nil {
			warnf(c, "refill pool %s: %v", shape, err)
			return
		}
		args := []string{"--root", root}
		if r := c.String("runsc"); r != "" {
			args = append(args, "--runsc", r)
		}
		cmd := exec.Command(self, append(args, "pool", "refill", shape)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			warnf(c, "refill pool %s: %v", shape, err)
			return
		}
		go cmd.Wait() // a long-lived flmbox (instance) reaps it
	}
}

func poolRefillCommand() *cli.Command {
	return &cli.Command{
		Name:      "refill",
		Hidden:    true, // what flmbox starts in the background
		Usage:     "make sandboxes for the pool of SHAPE until it holds its size",
		ArgsUsage: "SHAPE",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("pool refill takes one SHAPE", exitFlmboxFailed)
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			return m.Plumbing().Refill(c.Context, c.Args().First())
		},
	}
}

// poolReturnCommand gives back the sandbox that the flmbox command took from
// its pool for a run --image and called itself (cmd/flmbox/pool.go), and
// exits as run --image does once its result is printed: with the call's
// status and message; if the sandbox could not be given back, saying so (a
// warning when the call failed, flmbox's failure when it succeeded) unless
// --quiet (the call was interrupted or failed to run).
func poolReturnCommand() *cli.Command {
	return &cli.Command{
		Name:      "return",
		Hidden:    true, // what flmbox runs after a pooled run --image
		Usage:     "give back sandbox NAME, taken from its pool by flmbox run --image, and exit with --status",
		ArgsUsage: "NAME",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "status", Usage: "the exit status of the call"},
			&cli.StringFlag{Name: "message", Usage: "what to say of the call, last"},
			&cli.BoolFlag{Name: "quiet", Usage: "say nothing of a failure to give the sandbox back"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("pool return takes one NAME", exitFlmboxFailed)
			}
			m, err := openManager(c)
			if err == nil {
				err = m.Release(context.WithoutCancel(c.Context), c.Args().First())
			}
			status := c.Int("status")
			switch {
			case err == nil, c.Bool("quiet"):
			case status == 0:
				return err
			default:
				warnf(c, "%v", err)
			}
			if status == 0 {
				return nil
			}
			return cli.Exit(c.String("message"), status)
		},
	}
}
