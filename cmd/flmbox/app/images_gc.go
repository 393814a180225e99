package app

import (
	"fmt"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/rootfs"
)

func imagesGCCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "remove leftovers of interrupted pulls and the unused images selected by the flags; images in use by sandboxes are kept",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "max-bytes", Usage: "remove least recently used images until the cache holds at most this `SIZE`"},
			durationOrZeroFlag("unused-for", 0, "remove images not used for this `DURATION` (e.g. 168h)"),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("%s takes no arguments, got %q", c.Command.FullName(), c.Args().Slice())
			}
			o := rootfs.GCOptions{UnusedFor: c.Duration("unused-for")}
			if s := c.String("max-bytes"); s != "" {
				n, err := units.RAMInBytes(s)
				if err != nil || n < 0 {
					return fmt.Errorf("--max-bytes %q: want a size such as 20GiB", s)
				}
				o.MaxBytes = &n
			}
			store, err := openReconciledStore(c)
			if err != nil {
				return err
			}
			removed, err := store.GC(c.Context, o)
			var total int64
			for _, r := range removed {
				what := r.ManifestDigest
				if r.Leftover != "" {
					what = "what " + r.Leftover + " left"
				}
				fmt.Fprintf(c.App.Writer, "Deleted: %s (%s)\n", what, humanSize(r.SizeBytes))
				total += r.SizeBytes
			}
			fmt.Fprintf(c.App.Writer, "Total reclaimed space: %s\n", humanSize(total))
			if err != nil {
				return fmt.Errorf("images gc: %w", err) // a budget not met exits 125, as sandbox gc's
			}
			return nil
		},
	}
}
