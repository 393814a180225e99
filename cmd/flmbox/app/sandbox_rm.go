package app

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"
)

func sandboxRmCommand() *cli.Command {
	return &cli.Command{
		Name: "rm",
		Usage: "remove sandboxes and everything they hold (removing one that does not exist is not an error); " +
			"one whose pool (flmbox pool) is below its size is reset and goes back to it instead",
		ArgsUsage: "NAME...",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return fmt.Errorf("sandbox rm needs at least one NAME")
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			var errs []error
			for _, name := range c.Args().Slice() {
				errs = append(errs, m.Release(c.Context, name))
			}
			return errors.Join(errs...)
		},
	}
}
