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
			"every pool, or of one shape (--shape, as pool ls shows it), and forget their sizes; sandboxes in use are left alone",
		ArgsUsage: "[IMAGE]",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "expired", Usage: "remove only the sandboxes idle for longer than their pool's --idle-timeout, and keep the sizes (for cron)"},
			&cli.StringFlag{Name: "shape", Usage: "drain only the pool of this `SHAPE` (pool ls --json's shape)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fmt.Errorf("pool drain takes at most one IMAGE, got %q", c.Args().Slice())
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			if c.Bool("expired") && c.String("shape") != "" {
				return fmt.Errorf("pool drain: --expired applies to every pool; it takes no --shape")
			}
			gone, err := m.DrainPools(c.Context, sandbox.DrainOptions{Image: c.Args().First(), Shape: c.String("shape"), Expired: c.Bool("expired")})
			for _, name := range gone {
				fmt.Fprintln(c.App.Writer, name)
			}
			return err
		},
	}
}
