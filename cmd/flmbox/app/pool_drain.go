package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

func poolDrainCommand() *cli.Command {
	return &cli.Command{
		Name: "drain",
		Usage: "remove the idle sandboxes of the pools of IMAGE (as given to pool fill, or its manifest digest), or of " +
			"every pool, and forget their sizes; sandboxes in use are left alone",
		ArgsUsage: "[IMAGE]",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "expired", Usage: "remove only the sandboxes idle for longer than their pool's --idle-timeout, and keep the sizes (for cron)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fmt.Errorf("pool drain takes at most one IMAGE, got %q", c.Args().Slice())
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			gone, err := m.DrainPools(c.Context, sandbox.DrainOptions{Image: c.Args().First(), Expired: c.Bool("expired")})
			for _, name := range gone {
				fmt.Fprintln(c.App.Writer, name)
			}
			return err
		},
	}
}
