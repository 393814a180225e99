package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/mcpserver"
	"github.com/flmbox/flmbox/sandbox"
)

func mcpCommand() *cli.Command {
	return &cli.Command{
		Name:  "mcp",
		Usage: "serve sandboxes to an agent over the Model Context Protocol (stdio): tools run_code, create_session, list_sessions, end_session",
		Description: "An agent's MCP client starts flmbox mcp and speaks to it on stdin and stdout. The sandbox flags are\n" +
			"the most any tool call may ask for; a client's sessions are removed when it goes.",
		Flags: append(sandboxFlags(), sandboxEnvFlag(),
			&cli.StringFlag{Name: "image", Usage: "image every sandbox runs"},
			durationFlag("timeout", sandbox.DefaultTimeout, "the longest a call may run (timeout_seconds asks for less)"),
			&cli.IntFlag{Name: "max-sessions", Value: mcpserver.DefaultMaxSessions, Usage: "sessions one client may have at once"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("mcp takes no arguments, got %q", c.Args().Slice())
			}
			if err := required(c, "image"); err != nil {
				return err
			}
			spec, err := sandboxSpec(c)
			if err != nil {
				return err
			}
			if spec, err = spec.Normalize(); err != nil {
				return err
			}
			if c.Int("max-sessions") < 1 {
				return fmt.Errorf("--max-sessions %d: want 1 or more", c.Int("max-sessions"))
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			return mcpserver.ServeStdio(c.Context, m, mcpserver.Options{Spec: spec, MaxTimeout: c.Duration("timeout"),
				MaxSessions: c.Int("max-sessions"), Version: c.App.Version})
		},
	}
}
