package app

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/sandbox"
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
			var user string
			if cfg, err := store.Config(res.ManifestDigest); err == nil {
				user = cfg.Config.User
			}
			return printPrewarm(c, res, user)
		},
	}
}

// prewarmJSON is prewarm's JSON: the pull's result, and the USER the
// image's config asks for, which flmbox does not honour (the snippets run
// as 65534:65534).
type prewarmJSON struct {
	*rootfs.Result
	ImageUser string `json:"image_user,omitempty"`
}

func printPrewarm(c *cli.Context, res *rootfs.Result, user string) error {
	w := c.App.Writer
	if c.Bool("json") {
		return json.NewEncoder(w).Encode(prewarmJSON{res, user})
	}
	fmt.Fprintf(w, "index digest:    %s\n", res.IndexDigest)
	fmt.Fprintf(w, "platform:        %s\n", res.Platform)
	fmt.Fprintf(w, "manifest digest: %s\n", res.ManifestDigest)
	fmt.Fprintf(w, "rootfs:          %s\n", res.Rootfs)
	fmt.Fprintf(w, "size:            %s (%d bytes)\n", humanSize(res.SizeBytes), res.SizeBytes)
	fmt.Fprintf(w, "cached:          %t\n", res.Cached)
	if user != "" {
		fmt.Fprintf(w, "image user:      %s (not honoured: snippets run as %d:%d)\n", user, sandbox.UID, sandbox.GID)
	}
	return nil
}
