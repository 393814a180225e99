package app

import "github.com/urfave/cli/v2"

func sandboxCommand() *cli.Command {
	return &cli.Command{
		Name:        "sandbox",
		Usage:       "create, list, suspend, resume, release and remove persistent sandboxes",
		Subcommands: []*cli.Command{sandboxCreateCommand(), sandboxLsCommand(), sandboxRmCommand(), sandboxReleaseCommand(), sandboxSuspendCommand(), sandboxResumeCommand(), sandboxGCCommand()},
	}
}
