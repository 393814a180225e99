package app

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/flmbox/flmbox/rootfs"
)

func prewarmCommand() *cli.Command {
	return &cli.Command{
		Name:      "prewarm",
		Usage:     "pull IMAGE, verify it and unpack it into the rootfs cache",
		ArgsUsage: "IMAGE (name[:tag] | name@sha256:… | oci-layout:PATH[@sha256:…])",
		Flags:     append(pullFlags(), jsonFlag),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("prewarm takes one IMAGE argument, got %d", c.NArg())
			}
			opts, err := pullOptions(c)
			if err != nil {
				return err
			}
			store, err := openStore(c)
			if err != nil {
				return err
			}
			switch f, ok := c.App.ErrWriter.(*os.File); {
			case c.Bool("debug"):
				opts.Progress = newDebugProgress(c.App.ErrWriter)
			case ok && !c.Bool("json") && term.IsTerminal(int(f.Fd())):
				p := newTTYProgress(f)
				defer p.Close()
				opts.Progress = p
			}
			res, err := store.Prewarm(c.Context, c.Args().First(), opts)
			if err != nil {
				return err
			}
			return printPrewarm(c, res)
		},
	}
}

func printPrewarm(c *cli.Context, res *rootfs.Result) error {
	w := c.App.Writer
	if c.Bool("json") {
		return json.NewEncoder(w).Encode(res)
	}
	fmt.Fprintf(w, "index digest:    %s\n", res.IndexDigest)
	fmt.Fprintf(w, "platform:        %s\n", res.Platform)
	fmt.Fprintf(w, "manifest digest: %s\n", res.ManifestDigest)
	fmt.Fprintf(w, "rootfs:          %s\n", res.Rootfs)
	fmt.Fprintf(w, "size:            %s (%d bytes)\n", humanSize(res.SizeBytes), res.SizeBytes)
	fmt.Fprintf(w, "cached:          %t\n", res.Cached)
	return nil
}
