package app

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"
)

func pipcacheLsCommand() *cli.Command {
	return &cli.Command{
		Name:    "ls",
		Aliases: []string{"list"},
		Usage:   "list the cached wheels",
		Flags:   []cli.Flag{jsonFlag},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("%s takes no arguments, got %q", c.Command.FullName(), c.Args().Slice())
			}
			cache, err := openPipcache(c)
			if err != nil {
				return err
			}
			wheels, err := cache.List(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(wheels)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tSIZE\tADDED\tDIGEST\tFILE")
			for _, w := range wheels {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\t%s\t%s\n", w.Name, w.Version, humanSize(w.Size),
					units.HumanDuration(time.Since(w.Added)), orDash(shortDigest(w.Digest)), w.Filename)
			}
			return tw.Flush()
		},
	}
}
