package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/internal/warmcall"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/snippet/wire"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a Python or shell snippet in a sandbox",
		ArgsUsage: "(-c CODE | FILE | -)",
		Flags: append(sandboxFlags(),
			&cli.StringFlag{Name: "sandbox", Usage: "run in this persistent sandbox"},
			&cli.StringFlag{Name: "image", Usage: "run in a fresh sandbox from IMAGE, removed afterwards"},
			&cli.StringFlag{Name: "language", Aliases: []string{"l"}, Value: wire.LanguagePython, Usage: "python or shell"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "kill the snippet after this long (exit status 124)"},
			&cli.StringFlag{Name: "code", Aliases: []string{"c"}, Usage: "the code to run"},
			&cli.StringFlag{Name: "max-output", Value: "1MiB", Usage: "bytes of stdout and of stderr kept (head and tail)"},
			&cli.BoolFlag{Name: "reset", Usage: "with --sandbox: first return the sandbox to a clean state (kill its processes, empty /tmp and /dev/shm)"},
			&cli.StringFlag{Name: "batch", Usage: "run a batch of 1 to 64 snippets from `FILE` (- for stdin) and print a JSON array of results in input order"},
			&cli.IntFlag{Name: "parallel", Usage: "run at most N batch snippets at once (default: the number of CPUs)"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			if err := refuseCreateFlags(c); err != nil {
				return err
			}
			if path := c.String("batch"); path != "" {
				if c.NArg() != 0 || c.IsSet("code") {
					return fmt.Errorf("--batch takes its codes from FILE, not from -c or arguments")
				}
				reqs, err := readBatch(c, path)
				if err != nil {
					return err
				}
				return printBatch(c, runBatch(c, reqs, c.Int("parallel")))
			}
			req, err := snippetRequest(c)
			if err != nil {
				return err
			}
			res, cleanup, err := runSnippet(c, req)
			if err != nil {
				return err
			}
			defer cleanup() // after the result is out: a fresh sandbox is removed
			return printResult(c, res)
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
			return fmt.Errorf("--%s configures a new sandbox (with --image); sandbox %q keeps the settings it was created with: drop --%s, or create a sandbox with it (flmbox sandbox create --%s ...)", flag, name, flag, flag)
		}
	}
	return nil
}

// snippetRequest reads the code and the run flags into a request.
func snippetRequest(c *cli.Context) (*wire.Request, error) {
	code, err := readCode(c)
	if err != nil {
		return nil, err
	}
	maxOut, err := parseSize("--max-output", c.String("max-output"))
	if err != nil {
		return nil, err
	}
	if c.Bool("reset") && c.String("sandbox") == "" {
		return nil, fmt.Errorf("--reset takes --sandbox NAME (a fresh sandbox from --image is clean already)")
	}
	req := &wire.Request{Version: wire.ProtocolVersion, Language: c.String("language"), Code: code,
		TimeoutMS: c.Duration("timeout").Milliseconds(), MaxOutput: maxOut, Reset: c.Bool("reset")}
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

// runSnippet runs req in the named sandbox, or in a fresh one from --image.
// cleanup removes the fresh sandbox; the caller runs it once the result is
// printed, so that the result does not wait for the removal.
func runSnippet(c *cli.Context, req *wire.Request) (res *wire.Result, cleanup func(), err error) {
	name, image := c.String("sandbox"), c.String("image")
	if (name == "") == (image == "") {
		return nil, nil, fmt.Errorf("give exactly one of --sandbox NAME and --image IMAGE")
	}
	if name != "" {
		if msg, ok := os.LookupEnv(warmcall.HungUpEnv); ok {
			// flmbox made this call and its agent hung up: explain why,
			// and never send the request again.
			os.Unsetenv(warmcall.HungUpEnv)
			sb, err := runtime.GetSandbox(c.String("root"), name)
			if err != nil {
				return nil, nil, err
			}
			return nil, nil, explainCallFailure(c.Context, c, sb, errors.New(msg))
		}
		res, err := callSandbox(c.Context, c, name, req)
		return res, func() {}, err
	}
	o, err := sandboxOptionsFrom(c)
	if err != nil {
		return nil, nil, err
	}
	sb, err := createSandbox(c.Context, c, o)
	if err != nil {
		return nil, nil, err
	}
	cleanup = func() {
		if err := removeSandbox(context.WithoutCancel(c.Context), c, sb.Name); err != nil {
			warnf(c, "remove sandbox %s: %v", sb.Name, err)
		}
	}
	res, err = callSandbox(c.Context, c, sb.Name, req)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return res, cleanup, nil
}

// callSandbox sends req to a sandbox's agent. A sandbox whose agent does not
// answer is reported at once, with its state.
func callSandbox(ctx context.Context, c *cli.Context, name string, req *wire.Request) (*wire.Result, error) {
	sb, err := runtime.GetSandbox(c.String("root"), name)
	if err != nil {
		return nil, err
	}
	req.Limits = snippetLimits(sb.Limits)
	warmcall.Touch(sb.Dir)
	res, err := wire.Call(ctx, agentSocketPath(sb), req)
	if err != nil {
		return nil, explainCallFailure(ctx, c, sb, err)
	}
	return res, nil
}

// explainCallFailure adds to err, the failure of a call to sb, that the
// sandbox is dead if it is.
func explainCallFailure(ctx context.Context, c *cli.Context, sb *runtime.Sandbox, err error) error {
	if errors.Is(err, errdefs.ErrPermissionDenied) || ctx.Err() != nil {
		return err // the socket was replaced, or the call cancelled: say so, not "dead"
	}
	rt, rerr := openRuntime(c)
	if rerr != nil {
		return fmt.Errorf("%w (and finding its state: %w)", err, rerr)
	}
	if sandboxState(ctx, rt, sb) == runtime.StateDead {
		return fmt.Errorf("sandbox %s is dead (its gVisor processes are gone); remove it with flmbox sandbox rm %s and create another: %w", sb.Name, sb.Name, err)
	}
	return err
}

// snippetLimits bounds a snippet's own process well inside the sandbox's
// cgroup limits, so that a runaway snippet fails alone and the sandbox lives.
func snippetLimits(l runtime.Limits) wire.Limits {
	return warmcall.SnippetLimits(l.MemoryBytes, l.Pids)
}

// printResult prints a result and returns the exit status: the snippet's,
// 124 on timeout, 125 if flmbox failed to run it.
func printResult(c *cli.Context, res *wire.Result) error {
	code, msg, err := warmcall.Print(c.App.Writer, c.App.ErrWriter, res, c.Bool("json"), c.Duration("timeout"))
	if err != nil || code == 0 {
		return err
	}
	return cli.Exit(msg, code)
}
