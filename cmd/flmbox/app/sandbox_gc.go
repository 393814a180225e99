package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

// gcAction is a line of `sandbox gc --json`.
type gcAction struct {
	Name        string  `json:"name"`
	Action      string  `json:"action"`
	Reason      string  `json:"reason"`
	IdleSeconds float64 `json:"idle_seconds"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	DryRun      bool    `json:"dry_run,omitempty"`
	Error       string  `json:"error,omitempty"`
}

func sandboxGCCommand() *cli.Command {
	return &cli.Command{
		Name: "gc",
		Usage: "suspend and remove sandboxes idle for long, and keep the running ones under a budget, least recently " +
			"used first (for cron); pooled ones, those a running flmbox holds and those in a call are left alone",
		Flags: []cli.Flag{
			durationFlag("suspend-idle", 0, "suspend running sandboxes not called for longer than this"),
			durationFlag("remove-idle", 0, "remove sandboxes, running or suspended, not called for longer than this (oldest first)"),
			&cli.IntFlag{Name: "max-running", Usage: "suspend the least recently used running sandboxes until at most `N` run " +
				"(every running sandbox counts, pooled and held ones too)"},
			&cli.StringFlag{Name: "max-memory", Usage: "suspend the least recently used running sandboxes until the running ones " +
				"hold at most this much host memory (`SIZE`, such as 8GiB): each one's memory cgroup usage less its inactive " +
				"file cache, as docker stats counts it"},
			&cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}, Usage: "only say what would be done (sandboxes in a call now are left alone, as gc leaves them)"},
			jsonFlag,
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("sandbox gc takes no arguments, got %q", c.Args().Slice())
			}
			o, err := gcOptions(c)
			if err != nil {
				return err
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			acts, err := m.GC(c.Context, o)
			if perr := printGC(c, o, acts); perr != nil {
				return perr
			}
			var budget *sandbox.BudgetError
			if errors.As(err, &budget) {
				err = advise(err, "calls end and owners release their sandboxes: run gc again later; pooled sandboxes go with flmbox pool drain")
			}
			return err
		},
	}
}

// gcOptions reads sandbox gc's flags.
func gcOptions(c *cli.Context) (sandbox.GCOptions, error) {
	o := sandbox.GCOptions{SuspendIdle: c.Duration("suspend-idle"), RemoveIdle: c.Duration("remove-idle"), DryRun: c.Bool("dry-run")}
	if c.IsSet("max-running") {
		n := c.Int("max-running")
		o.MaxRunning = &n
	}
	if c.IsSet("max-memory") {
		s := c.String("max-memory")
		n, err := units.RAMInBytes(s)
		if err != nil || n < 0 {
			return o, fmt.Errorf("--max-memory %q: want a size such as 8GiB: %w", s, errdefs.ErrInvalidArgument)
		}
		o.MaxMemory = &n
	}
	if o.SuspendIdle == 0 && o.RemoveIdle == 0 && o.MaxRunning == nil && o.MaxMemory == nil {
		return o, fmt.Errorf("sandbox gc needs --suspend-idle, --remove-idle, --max-running or --max-memory")
	}
	return o, nil
}

// printGC prints what gc did, a line per sandbox (or JSON).
func printGC(c *cli.Context, o sandbox.GCOptions, acts []sandbox.GCAction) error {
	if c.Bool("json") {
		out := make([]gcAction, 0, len(acts))
		for _, a := range acts {
			j := gcAction{Name: a.Name, Action: string(a.Action), Reason: string(a.Reason), IdleSeconds: a.Idle.Seconds(), MemoryBytes: a.MemoryBytes, DryRun: o.DryRun && a.Action != sandbox.GCSkip}
			if a.Err != nil {
				j.Error = a.Err.Error()
			}
			out = append(out, j)
		}
		return json.NewEncoder(c.App.Writer).Encode(out)
	}
	for _, a := range acts {
		verb := a.Action
		if o.DryRun && a.Action != sandbox.GCSkip {
			verb = "would " + verb
		}
		about := "idle " + units.HumanDuration(a.Idle.Round(time.Second))
		if a.MemoryBytes > 0 {
			about += ", " + units.BytesSize(float64(a.MemoryBytes))
		}
		why := ""
		switch a.Reason {
		case sandbox.GCMaxRunning, sandbox.GCMaxMemory:
			why = ": over --" + string(a.Reason)
		case sandbox.GCInCall:
			why = ": " + string(a.Reason)
		}
		status := ""
		if a.Err != nil {
			status = ": failed"
		}
		fmt.Fprintf(c.App.Writer, "%s %s (%s)%s%s\n", verb, a.Name, about, why, status)
	}
	return nil
}
