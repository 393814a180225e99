package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/pipcache"
)

func pipcacheRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "remove cached wheels of a project, or of one version (removing what is not cached is not an error)",
		ArgsUsage: "NAME[==VERSION]...",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return fmt.Errorf("pipcache rm needs at least one NAME or NAME==VERSION")
			}
			sels := make([]pipcache.Selector, c.NArg())
			for i, a := range c.Args().Slice() {
				var err error
				if sels[i], err = pipcache.ParseSelector(a); err != nil {
					return err
				}
			}
			cache, err := openPipcache(c)
			if err != nil {
				return err
			}
			removed, err := cache.Remove(c.Context, sels)
			for _, w := range removed {
				fmt.Fprintf(c.App.Writer, "removed %s\n", w.Filename)
			}
			if err != nil {
				return err
			}
			for i, s := range sels {
				if !anyMatches(s, removed) {
					warnf(c, "no cached wheel matches %s (see flmbox pipcache ls)", c.Args().Get(i))
				}
			}
			return nil
		},
	}
}

func anyMatches(s pipcache.Selector, wheels []*pipcache.Wheel) bool {
	for _, w := range wheels {
		if s.Matches(w) {
			return true
		}
	}
	return false
}
