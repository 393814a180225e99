package app

import (
	"errors"
	"fmt"

	"github.com/flmbox/flmbox/sandbox"
	"github.com/urfave/cli/v2"
)

func sandboxSuspendCommand() *cli.Command {
	return &cli.Command{
		Name: "suspend",
		Usage: "save sandboxes to disk (their /tmp, processes and pip installs) and stop them: no host memory, no " +
			"process; they survive a reboot; run --sandbox or sandbox resume brings one back",
		ArgsUsage: "NAME...",
		Action: func(c *cli.Context) error {
			return eachSandbox(c, "suspend", (*sandbox.Manager).Suspend)
		},
	}
}

func sandboxResumeCommand() *cli.Command {
	return &cli.Command{
		Name:      "resume",
		Usage:     "bring suspended sandboxes back as they were (resuming a running one does nothing)",
		ArgsUsage: "NAME...",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return fmt.Errorf("sandbox resume needs at least one NAME")
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			var errs []error
			for _, name := range c.Args().Slice() {
				_, err := m.Resume(c.Context, name)
				errs = append(errs, err)
			}
			m.Wait() // the resumes' image removals
			return errors.Join(errs...)
		},
	}
}
