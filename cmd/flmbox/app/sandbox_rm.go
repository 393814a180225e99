package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

func sandboxRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "remove sandboxes and everything they hold (removing one that does not exist is not an error)",
		ArgsUsage: "NAME...",
		Action: func(c *cli.Context) error {
			return eachSandbox(c, "rm", (*sandbox.Manager).Remove)
		},
	}
}

func sandboxReleaseCommand() *cli.Command {
	return &cli.Command{
		Name: "release",
		Usage: "give sandboxes back to the warm pool of their shape (flmbox pool), reset as new, if it is below its size; " +
			"remove them otherwise",
		ArgsUsage: "NAME...",
		Action: func(c *cli.Context) error {
			return eachSandbox(c, "release", (*sandbox.Manager).Release)
		},
	}
}

// eachSandbox does op to every sandbox the command line names.
func eachSandbox(c *cli.Context, verb string, op func(*sandbox.Manager, context.Context, string) error) error {
	if c.NArg() == 0 {
		return fmt.Errorf("sandbox %s needs at least one NAME", verb)
	}
	m, err := openManager(c)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range c.Args().Slice() {
		errs = append(errs, op(m, c.Context, name))
	}
	return errors.Join(errs...)
}
