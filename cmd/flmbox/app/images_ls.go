package app

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/rootfs"
)

func imagesLsCommand() *cli.Command {
	return &cli.Command{
		Name:    "ls",
		Aliases: []string{"list"},
		Usage:   "list cached images",
		Flags:   []cli.Flag{jsonFlag},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("%s takes no arguments, got %q", c.Command.FullName(), c.Args().Slice())
			}
			store, err := openStore(c)
			if err != nil {
				return err
			}
			imgs, err := store.List(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if imgs == nil {
					imgs = []*rootfs.Image{}
				}
				return json.NewEncoder(c.App.Writer).Encode(imgs)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MANIFEST\tPLATFORM\tSIZE\tSHARED\tUNIQUE\tLAST USED\tIN USE BY\tNAMES")
			for _, img := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", shortDigest(img.ManifestDigest), img.Platform,
					humanSize(img.SizeBytes), humanSize(img.SharedBytes), humanSize(img.UniqueBytes),
					units.HumanDuration(time.Since(img.LastUsed))+" ago",
					orDash(strings.Join(img.Holders, ",")), orDash(strings.Join(img.Names, ", ")))
			}
			return tw.Flush()
		},
	}
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
