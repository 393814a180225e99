package app

import (
	"fmt"
	"time"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

func sandboxGCCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "suspend and remove sandboxes idle for long (for cron); pooled ones and those a running flmbox holds are left alone",
		Flags: []cli.Flag{
			durationFlag("suspend-idle", 0, "suspend running sandboxes not called for longer than this"),
			durationFlag("remove-idle", 0, "remove sandboxes, running or suspended, not called for longer than this"),
			&cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}, Usage: "only say what would be done"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("sandbox gc takes no arguments, got %q", c.Args().Slice())
			}
			o := sandbox.GCOptions{SuspendIdle: c.Duration("suspend-idle"), RemoveIdle: c.Duration("remove-idle"), DryRun: c.Bool("dry-run")}
			if o.SuspendIdle == 0 && o.RemoveIdle == 0 {
				return fmt.Errorf("sandbox gc needs --suspend-idle, --remove-idle or both")
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			acts, err := m.GC(c.Context, o)
			for _, a := range acts {
				verb := a.Action
				if o.DryRun {
					verb = "would " + verb
				}
				status := ""
				if a.Err != nil {
					status = ": failed"
				}
				fmt.Fprintf(c.App.Writer, "%s %s (idle %s)%s\n", verb, a.Name, units.HumanDuration(a.Idle.Round(time.Second)), status)
			}
			return err
		},
	}
}
