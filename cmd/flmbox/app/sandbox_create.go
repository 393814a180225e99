package app

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

func sandboxCreateCommand() *cli.Command {
	return &cli.Command{
		Name:  "create",
		Usage: "create a persistent sandbox from IMAGE and print its name",
		Flags: append(sandboxFlags(),
			&cli.StringFlag{Name: "name", Usage: "the sandbox's name (default: generated)"},
			&cli.StringFlag{Name: "image", Required: true, Usage: "image to run (prewarmed if needed)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("sandbox create takes no arguments, got %q", c.Args().Slice())
			}
			o, err := sandboxOptionsFrom(c)
			if err != nil {
				return err
			}
			o.name = c.String("name")
			sb, err := createSandbox(c.Context, c, o)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, sb.Name)
			return nil
		},
	}
}
