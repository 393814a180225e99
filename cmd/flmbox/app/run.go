package app

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a Python or shell snippet in a sandbox",
		ArgsUsage: "(-c CODE | FILE | -)",
		Flags:     append(sandboxFlags(), tableFlags(runcmd.RunFlags)...),
		Action: func(c *cli.Context) error {
			if err := refuseCreateFlags(c); err != nil {
				return err
			}
			if c.String("batch") != "" {
				return runBatch(c)
			}
			if c.IsSet("parallel") {
				return fmt.Errorf("--parallel applies to --batch FILE only")
			}
			req, err := snippetRequest(c)
			if err != nil {
				return err
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			name, image := c.String("sandbox"), c.String("image")
			switch {
			case (name == "") == (image == ""):
				return fmt.Errorf("give exactly one of --sandbox NAME and --image IMAGE")
			case name != "":
				res, err := m.Call(c.Context, name, req)
				resumed := false
				if errors.Is(err, record.ErrSuspended) {
					// Resumed first, said on stderr (or in the JSON).
					if resumed, err = m.Resume(c.Context, name); err == nil {
						if resumed && !c.Bool("json") {
							fmt.Fprintf(c.App.ErrWriter, "flmbox: resumed sandbox %s\n", name)
						}
						res, err = m.Call(c.Context, name, req)
					}
				}
				if errors.Is(err, wire.ErrInterrupted) {
					return printInterrupted(c, res)
				}
				if err != nil {
					return advise(err, runcmd.CallHint(err, name))
				}
				err = printResultResumed(c, res, resumed)
				m.Wait() // the resume's image removal, after the output
				return err
			}
			spec, err := specFrom(c)
			if err != nil {
				return err
			}
			var printed error
			delivered := false
			err = m.RunOnce(c.Context, spec, req, func(res *wire.Result) {
				delivered = true
				if c.Context.Err() != nil {
					printed = printInterrupted(c, res)
				} else {
					printed = printResult(c, res)
				}
			})
			switch {
			case errors.Is(err, wire.ErrInterrupted) && !delivered:
				return printInterrupted(c, nil)
			case errors.Is(err, wire.ErrInterrupted):
				return printed
			case printed != nil:
				if err != nil {
					warnf(c, "%v", err)
				}
				return printed
			}
			return err
		},
	}
}

// refuseCreateFlags refuses, with --sandbox, the flags that configure a new
// sandbox: an existing one keeps the settings it was created with, and a
// flag silently ignored would mislead.
func refuseCreateFlags(c *cli.Context) error {
	name := c.String("sandbox")
	if name == "" {
		return nil
	}
	for _, f := range sandboxFlags() {
		if flag := f.Names()[0]; c.IsSet(flag) {
			return advise(fmt.Errorf("--%s configures a new sandbox (with --image); sandbox %q keeps the settings it was created with", flag, name),
				fmt.Sprintf("drop --%s, or create a sandbox with it (flmbox sandbox create --%s ...)", flag, flag))
		}
	}
	return nil
}

// snippetRequest reads the code and the run flags into a request.
func snippetRequest(c *cli.Context) (sandbox.Request, error) {
	code, err := readCode(c)
	if err != nil {
		return sandbox.Request{}, err
	}
	maxOut, err := parseSize("--max-output", c.String("max-output"))
	if err != nil {
		return sandbox.Request{}, err
	}
	if c.Duration("timeout") <= 0 || c.String("language") == "" {
		// A zero Request field takes its default; on the command line
		// it is a mistake.
		return sandbox.Request{}, fmt.Errorf("--timeout %s, --language %q: want a positive timeout and python or shell", c.Duration("timeout"), c.String("language"))
	}
	if c.Bool("reset") && c.String("sandbox") == "" {
		return sandbox.Request{}, fmt.Errorf("--reset takes --sandbox NAME (a fresh sandbox from --image is clean already)")
	}
	req := sandbox.Request{Language: c.String("language"), Code: code, Timeout: c.Duration("timeout"),
		MaxOutput: maxOut, Reset: c.Bool("reset")}
	if err := req.Validate(); err != nil {
		return req, err
	}
	// Last: the socket is checked once the rest is known to be good.
	req.Callback, err = callbackFrom(c)
	if err != nil {
		return req, err
	}
	return req, req.Validate()
}

func readCode(c *cli.Context) (string, error) {
	switch {
	case c.IsSet("code") && c.NArg() == 0:
		return c.String("code"), nil
	case !c.IsSet("code") && c.NArg() == 1 && c.Args().First() == "-":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 4<<20))
		return string(b), err
	case !c.IsSet("code") && c.NArg() == 1:
		b, err := os.ReadFile(c.Args().First())
		if err != nil {
			return "", fmt.Errorf("read code: %w", err)
		}
		return string(b), nil
	}
	return "", fmt.Errorf("give the code once: -c CODE, a FILE, or - for stdin")
}

// printInterrupted prints what an interrupted call returned (res, or nil
// if the agent did not answer the interrupt) and returns the exit status
// of the signal: 130 for SIGINT, 143 for SIGTERM.
func printInterrupted(c *cli.Context, res *wire.Result) error {
	code, err := runcmd.PrintInterrupted(c.Context, c.App.Writer, c.App.ErrWriter, res, c.Bool("json"))
	if err != nil {
		return err
	}
	return cli.Exit("", code)
}

// printResult prints a result and returns the exit status: the snippet's,
// 124 on timeout, 125 if flmbox failed to run it.
func printResult(c *cli.Context, res *wire.Result) error { return printResultResumed(c, res, false) }

// printResultResumed is printResult for a call to a sandbox that was
// resumed first (its JSON says "resumed": true).
func printResultResumed(c *cli.Context, res *wire.Result, resumed bool) error {
	code, msg, err := runcmd.PrintResumed(c.App.Writer, c.App.ErrWriter, res, c.Bool("json"), c.Duration("timeout"), resumed)
	if err == nil && !c.Bool("json") {
		io.WriteString(c.App.ErrWriter, runcmd.CallbackNote(res, c.Int("callback-conns")))
	}
	if err != nil || code == 0 {
		return err
	}
	return cli.Exit(msg, code)
}
