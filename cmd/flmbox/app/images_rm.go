package app

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"
)

func imagesRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "remove cached images (removing what is not cached is not an error)",
		ArgsUsage: "REF|DIGEST|ID...",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return fmt.Errorf("images rm needs at least one REF, DIGEST or ID (as images ls shows it)")
			}
			store, err := openReconciledStore(c)
			if err != nil {
				return err
			}
			var errs []error
			for _, arg := range c.Args().Slice() {
				removed, err := store.Remove(c.Context, arg)
				for _, r := range removed {
					fmt.Fprintf(c.App.Writer, "Deleted: %s (%s)\n", r.ManifestDigest, humanSize(r.SizeBytes))
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("remove %s: %w", arg, err))
				}
			}
			return errors.Join(errs...)
		},
	}
}
