package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/pipcache"
)

func pipcacheCommand() *cli.Command {
	return &cli.Command{
		Name:  "pipcache",
		Usage: "manage the wheel cache that sandboxes install Python packages from",
		Subcommands: []*cli.Command{pipcacheAddCommand(), pipcacheFetchCommand(), pipcacheLsCommand(),
			pipcacheRmCommand()},
	}
}

// openPipcache opens the wheel cache under the state root.
func openPipcache(c *cli.Context) (*pipcache.Cache, error) {
	root, err := ensureRoot(c)
	if err != nil {
		return nil, err
	}
	return pipcache.Open(stateroot.Pipcache(root), nil)
}

// printAdded prints the wheels an import brought, one per line.
func printAdded(c *cli.Context, wheels []*pipcache.Wheel) {
	for _, w := range wheels {
		state := "added"
		if w.AlreadyCached {
			state = "already cached"
		}
		fmt.Fprintf(c.App.Writer, "%s\t%s\t%s\n", w.Filename, w.Digest, state)
	}
}
