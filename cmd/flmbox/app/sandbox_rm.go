package app

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"
)

func sandboxRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "remove sandboxes and everything they hold (removing one that does not exist is not an error)",
		ArgsUsage: "NAME...",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return fmt.Errorf("sandbox rm needs at least one NAME")
			}
			var errs []error
			for _, name := range c.Args().Slice() {
				if err := removeSandbox(c.Context, c, name); err != nil {
					errs = append(errs, fmt.Errorf("remove sandbox %s: %w", name, err))
				}
			}
			return errors.Join(errs...)
		},
	}
}
