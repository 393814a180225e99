package app

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

func pipcacheAddCommand() *cli.Command {
	return &cli.Command{
		Name:      "add",
		Usage:     "validate wheel files and add them to the cache (all or none)",
		ArgsUsage: "FILE.whl...",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return fmt.Errorf("pipcache add needs at least one FILE.whl")
			}
			cache, err := openPipcache(c)
			if err != nil {
				return err
			}
			wheels, err := cache.Add(c.Context, c.Args().Slice())
			if err != nil {
				return err
			}
			printAdded(c, wheels)
			return nil
		},
	}
}
