package app

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"

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
			&cli.StringFlag{Name: "listen", Usage: "serve MCP's streamable HTTP on `ADDR` (host:port) instead of stdio"},
			&cli.StringFlag{Name: "token-file", Usage: "with --listen, a file holding the bearer token every request must carry (needed unless ADDR is a loopback address)"},
			durationFlag("session-idle", 30*time.Minute, "remove a session no call used for this long; with --listen, also end a client's MCP session (and its sessions) after this long without a request"),
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
			o := mcpserver.Options{Spec: spec, MaxTimeout: c.Duration("timeout"), MaxSessions: c.Int("max-sessions"), Version: c.App.Version,
				SessionIdle: c.Duration("session-idle")}
			if c.String("listen") == "" {
				m, err := openManager(c)
				if err != nil {
					return err
				}
				return mcpserver.ServeStdio(c.Context, m, o)
			}
			return serveMCPHTTP(c, o)
		},
	}
}

// serveMCPHTTP serves flmbox mcp --listen: the token read and required
// off loopback before anything listens.
func serveMCPHTTP(c *cli.Context, o mcpserver.Options) error {
	h := mcpserver.HTTPOptions{SessionIdle: c.Duration("session-idle")}
	if f := c.String("token-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		if h.Token = strings.TrimSpace(string(b)); h.Token == "" || strings.ContainsAny(h.Token, " \t\n") {
			return fmt.Errorf("--token-file %s: want one token, with no spaces", f)
		}
	}
	host, _, err := net.SplitHostPort(c.String("listen"))
	if err != nil {
		return fmt.Errorf("--listen %q: want host:port: %w", c.String("listen"), err)
	}
	if ip := net.ParseIP(host); h.Token == "" && (ip == nil || !ip.IsLoopback()) {
		return advise(fmt.Errorf("--listen %s without a token: any host could run code here", c.String("listen")),
			"give --token-file FILE, or listen on 127.0.0.1")
	}
	ln, err := net.Listen("tcp", c.String("listen"))
	if err != nil {
		return err
	}
	m, err := openManager(c)
	if err != nil {
		ln.Close()
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "flmbox mcp: serving MCP over HTTP on %s\n", ln.Addr())
	return mcpserver.ServeHTTP(c.Context, m, o, h, ln)
}
