package app

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

func poolFillCommand() *cli.Command {
	return &cli.Command{
		Name: "fill",
		Usage: "set the size of the pool of IMAGE's shape (IMAGE with these sandbox flags) and make sandboxes until it " +
			"holds that many idle ones",
		ArgsUsage: "IMAGE",
		Flags: append(sandboxFlags(), sandboxEnvFlag(),
			&cli.IntFlag{Name: "size", Usage: fmt.Sprintf("idle sandboxes the pool keeps (0 to %d; required)", sandbox.MaxPoolSize)},
			durationFlag("idle-timeout", sandbox.DefaultIdleTimeout, "remove a sandbox idle in the pool for longer"),
			&cli.IntFlag{Name: "parallel", Usage: "sandboxes made at once (default: the number of CPUs)"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("pool fill takes one IMAGE, got %q", c.Args().Slice())
			}
			if err := required(c, "size"); err != nil {
				return err
			}
			spec, err := sandboxSpec(c)
			if err != nil {
				return err
			}
			spec.Image = c.Args().First()
			m, err := openManager(c)
			if err != nil {
				return err
			}
			start := time.Now()
			p, err := m.FillPool(c.Context, spec, sandbox.PoolOptions{Size: c.Int("size"), IdleTimeout: c.Duration("idle-timeout"), Parallel: c.Int("parallel")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printPools(c, []*sandbox.Pool{p})
			}
			fmt.Fprintf(c.App.Writer, "pool %s of %s: %d idle, size %d (%s)\n", p.Shape, p.Spec.Image, len(p.Idle), p.Size,
				time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
