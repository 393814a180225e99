package main

import (
	"fmt"
	"net"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/snippet"
)

// agentCommand is the resident agent that runs inside every sandbox, started
// by flmbox as the sandbox's first process. It is not for users.
func agentCommand() *cli.Command {
	return &cli.Command{
		Name:   "agent",
		Hidden: true,
		Usage:  "serve snippets on a Unix socket (inside a sandbox)",
		Flags:  []cli.Flag{&cli.StringFlag{Name: "socket", Required: true, Usage: "Unix socket to listen on"}},
		Action: func(c *cli.Context) error {
			path := c.String("socket")
			_ = os.Remove(path) // a socket left by an earlier agent
			ln, err := net.Listen("unix", path)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", path, err)
			}
			return (&snippet.Agent{}).Serve(c.Context, ln)
		},
	}
}
