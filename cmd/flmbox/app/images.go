package app

import "github.com/urfave/cli/v2"

func imagesCommand() *cli.Command {
	return &cli.Command{
		Name:        "images",
		Usage:       "list and remove cached images",
		Subcommands: []*cli.Command{imagesLsCommand(), imagesRmCommand(), imagesGCCommand()},
	}
}
