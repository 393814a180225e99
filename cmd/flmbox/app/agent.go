package app

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	goruntime "runtime"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet"
)

// agentCommand is the resident agent that runs inside every sandbox, started
// by flmbox as the sandbox's first process. It is not for users.
func agentCommand() *cli.Command {
	return &cli.Command{
		Name:   "agent",
		Hidden: true,
		Usage:  "serve snippets on a Unix socket (inside a sandbox)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Required: true, Usage: "Unix socket to listen on"},
			&cli.BoolFlag{Name: "spares", Value: true, Usage: "start each language's next snippet process ahead of time"},
			&cli.StringFlag{Name: "limits", Usage: "the limits of the first spare, as JSON (snippet.Limits)"},
			&cli.StringFlag{Name: "meminfo", Value: "/proc/meminfo", Usage: "where the sandbox's memory use is read while snippets run; empty: no memory watch"},
			&cli.Int64Flag{Name: "memory-budget", Usage: "the bytes that snippets and /tmp may use together (default: MemTotal)"},
			&cli.StringSliceFlag{Name: "clean-dir", Value: cli.NewStringSlice("/tmp", "/dev/shm"), Usage: "a directory that a reset empties"},
		},
		Action: func(c *cli.Context) error {
			// Snippets run as the agent's user: they must not be able to
			// trace it or read its memory.
			if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
				return fmt.Errorf("make the agent non-dumpable: %w", err)
			}
			// One P: the agent's goroutines wait on the snippet, and under
			// gVisor every scheduler handoff between threads is a costly
			// futex; more Ps only add spinning threads.
			goruntime.GOMAXPROCS(1)
			a := &snippet.Agent{Spares: c.Bool("spares"), CleanDirs: c.StringSlice("clean-dir"), MemInfo: c.String("meminfo"), MemoryBudget: c.Int64("memory-budget")}
			if l := c.String("limits"); l != "" {
				if err := json.Unmarshal([]byte(l), &a.SpareLimits); err != nil {
					return fmt.Errorf("--limits: %w", err)
				}
			}
			path := c.String("socket")
			_ = os.Remove(path) // a socket left by an earlier agent
			ln, err := net.Listen("unix", path)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", path, err)
			}
			return a.Serve(c.Context, ln)
		},
	}
}
