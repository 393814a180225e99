package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/sandbox"
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
			if c.Context.Err() != nil { // Ctrl-C while stdin was read
				return cli.Exit("", runcmd.InterruptStatus(c.Context))
			}
			if err != nil {
				return err
			}
			name, image := c.String("sandbox"), c.String("image")
			if (name == "") == (image == "") {
				return fmt.Errorf("give exactly one of --sandbox NAME and --image IMAGE")
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			if name != "" {
				return runInSandbox(c, m, name, req)
			}
			return runInImage(c, m, req)
		},
	}
}

// runInSandbox runs req in sandbox name, resumed first if it is suspended.
func runInSandbox(c *cli.Context, m *sandbox.Manager, name string, req sandbox.Request) error {
	res, err := cliResult(m.Call(c.Context, name, req))
	resumed := false
	if errors.Is(err, sandbox.ErrSuspended) {
		// Resumed first, said on stderr (or in the JSON).
		if resumed, err = m.Resume(c.Context, name); err == nil {
			if resumed && !c.Bool("json") {
				fmt.Fprintf(c.App.ErrWriter, "flmbox: resumed sandbox %s\n", name)
			}
			res, err = cliResult(m.Call(c.Context, name, req))
		}
	}
	switch {
	case errors.Is(err, sandbox.ErrInterrupted):
		return printInterrupted(c, res)
	case err != nil && c.Context.Err() != nil: // Ctrl-C before the code ran (a copy, a reset)
		return printInterrupted(c, nil)
	case err != nil:
		return advise(err, runcmd.CallHint(err, name))
	}
	err = printResultResumed(c, res, resumed)
	m.Wait() // the resume's image removal, after the output
	return err
}

// runInImage runs req in a clean sandbox of --image's (m.RunOnce).
func runInImage(c *cli.Context, m *sandbox.Manager, req sandbox.Request) error {
	spec, err := specFrom(c)
	if err != nil {
		return err
	}
	defer m.Wait() // the sandbox's release, after the output
	res, err := cliResult(m.RunOnce(c.Context, spec, req))
	switch {
	case res != nil && (errors.Is(err, sandbox.ErrInterrupted) || c.Context.Err() != nil):
		return printInterrupted(c, res)
	case err != nil && (errors.Is(err, sandbox.ErrInterrupted) || c.Context.Err() != nil):
		return printInterrupted(c, nil) // before the code ran, or with no answer from the agent
	case err != nil:
		return err
	}
	printed := printResult(c, res)
	writePoolHint(c, m, spec)
	return printed
}

// cliResult is a call's result as the command prints it: a snippet the
// sandbox could not start is a result with exit status -1 and why, as the
// flmbox command's own calls print it.
func cliResult(res *sandbox.Result, err error) (*runcmd.Result, error) {
	if nr := (*sandbox.NotRunError)(nil); errors.As(err, &nr) {
		return &runcmd.Result{ExitCode: -1, Error: nr.Reason, Missing: nr.NoInterpreter}, nil
	}
	if res == nil {
		return nil, err
	}
	out := &runcmd.Result{ExitCode: res.ExitCode, Stdout: runcmd.Output(res.Stdout), Stderr: runcmd.Output(res.Stderr),
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, Interrupted: res.Interrupted, Signal: res.Signal,
		DurationMS: float64(res.Duration) / float64(time.Millisecond)}
	if cb := res.Callbacks; cb != nil {
		out.Callbacks = &runcmd.Callbacks{Connections: cb.Connections, Refused: cb.Refused, BytesIn: cb.BytesIn, BytesOut: cb.BytesOut}
	}
	return out, err
}

// writePoolHint leaves the flmbox command a pool hint of this run --image
// command line (see runcmd's PoolHintKey), if the command can serve it from
// a warm pool itself: a digest reference, no sandbox flag but --tmp-size,
// only run flags that it takes, and a pool of its shape. Written after the
// result is out; a hint that cannot be written only leaves the command line
// to flmbox-core.
func writePoolHint(c *cli.Context, m *sandbox.Manager, spec sandbox.Spec) {
	if !runcmd.PoolHintable(spec.Image) {
		return
	}
	for _, f := range sandboxFlags() {
		if n := f.Names()[0]; n != "tmp-size" && c.IsSet(n) {
			return
		}
	}
	for _, f := range runcmd.RunFlags {
		if !f.Warm && f.Name != "image" && c.IsSet(f.Name) {
			return
		}
	}
	agent, err := m.Agent()
	if err != nil {
		return
	}
	self, err := os.Executable()
	if err != nil {
		return
	}
	key, pooled, err := m.Plumbing().PoolKey(c.Context, spec)
	if err != nil || !pooled {
		return
	}
	tmpSize := ""
	if c.IsSet("tmp-size") {
		tmpSize = c.String("tmp-size")
	}
	runcmd.WritePoolHint(m.Root(), runcmd.PoolHintKey(spec.Image, tmpSize, runcmd.FileID(self), runcmd.FileID(agent)), key)
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

// snippetRequest reads the code and the run flags into a request. Nothing
// is left to check once it returns but what only the sandbox knows; stdin
// (--interactive) is read last, once the rest is known to be good.
func snippetRequest(c *cli.Context) (sandbox.Request, error) {
	if c.Bool("interactive") && c.Args().First() == "-" {
		return sandbox.Request{}, fmt.Errorf("--interactive gives flmbox's stdin to the snippet: the code cannot come from stdin (-) too; give -c CODE or a FILE")
	}
	code, file, err := readCode(c)
	if err != nil {
		return sandbox.Request{}, err
	}
	maxOut, err := parseSize("--max-output", c.String("max-output"))
	if err != nil {
		return sandbox.Request{}, err
	}
	if c.String("language") == "" {
		// A zero Request field takes its default; on the command line
		// it is a mistake. (--timeout is positive: durationValue.)
		return sandbox.Request{}, fmt.Errorf("--language \"\": want python or shell")
	}
	if c.Bool("reset") && c.String("sandbox") == "" {
		return sandbox.Request{}, fmt.Errorf("--reset takes --sandbox NAME (a fresh sandbox from --image is clean already)")
	}
	req := sandbox.Request{Language: c.String("language"), Code: code, File: file, Timeout: c.Duration("timeout"),
		MaxOutput: maxOut, Reset: c.Bool("reset"), Env: listFlag(c, "env")}
	if err := req.Validate(); err != nil {
		return req, err
	}
	if req.CopyIn, err = copiesFrom(c); err != nil {
		return req, err
	}
	// The socket is checked once the rest is known to be good.
	if req.Callback, err = callbackFrom(c); err != nil {
		return req, err
	}
	if c.Bool("interactive") {
		if req.Stdin, err = readStdin(c.Context, c.App.Reader); err != nil {
			return req, err
		}
	}
	return req, req.Validate()
}

// readCode reads the code: -c CODE, FILE (run as a file of FILE's base
// name, as python3 FILE runs it: file is that name), or - (stdin).
func readCode(c *cli.Context) (code, file string, err error) {
	switch {
	case c.IsSet("code") && c.NArg() == 0:
		return c.String("code"), "", nil
	case !c.IsSet("code") && c.NArg() == 1 && c.Args().First() == "-":
		b, err := readAll(c.Context, c.App.Reader, 4<<20) // more than any code may be: Validate says so
		if err != nil {
			return "", "", fmt.Errorf("read code from stdin: %w", err)
		}
		return string(b), "", nil
	case !c.IsSet("code") && c.NArg() == 1:
		path := c.Args().First()
		b, err := os.ReadFile(path)
		if err != nil {
			return "", "", fmt.Errorf("read code: %w", err)
		}
		return string(b), filepath.Base(path), nil
	}
	return "", "", fmt.Errorf("give the code once: -c CODE, a FILE, or - for stdin")
}

// readStdin reads r, flmbox's stdin, to its end for --interactive.
func readStdin(ctx context.Context, r io.Reader) ([]byte, error) {
	b, err := readAll(ctx, r, sandbox.MaxStdinSize)
	switch {
	case err != nil:
		return nil, fmt.Errorf("--interactive: read stdin: %w", err)
	case len(b) > sandbox.MaxStdinSize:
		return nil, fmt.Errorf("--interactive: stdin holds more than %d bytes (8MiB), the most a snippet's stdin takes; copy it in with --copy HOST_PATH:/tmp/NAME and read that file", sandbox.MaxStdinSize)
	}
	return b, nil
}

// readAll reads r to its end, or to max+1 bytes, whichever comes first,
// and gives up when ctx ends: a terminal or a pipe may send nothing for
// ever, and Ctrl-C must still end flmbox (the read is left behind).
func readAll(ctx context.Context, r io.Reader, max int64) ([]byte, error) {
	type read struct {
		b   []byte
		err error
	}
	done := make(chan read, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(r, max+1))
		done <- read{b, err}
	}()
	select {
	case rd := <-done:
		return rd.b, rd.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// printInterrupted prints what an interrupted call returned (res, or nil
// if the agent did not answer the interrupt) and returns the exit status
// of the signal: 130 for SIGINT, 143 for SIGTERM.
func printInterrupted(c *cli.Context, res *runcmd.Result) error {
	code, err := runcmd.PrintInterrupted(c.Context, c.App.Writer, c.App.ErrWriter, res, c.Bool("json"))
	if err != nil {
		return err
	}
	return cli.Exit("", code)
}

// printResult prints a result and returns the exit status: the snippet's,
// 124 on timeout, 125 if flmbox failed to run it.
func printResult(c *cli.Context, res *runcmd.Result) error { return printResultResumed(c, res, false) }

// printResultResumed is printResult for a call to a sandbox that was
// resumed first (its JSON says "resumed": true).
func printResultResumed(c *cli.Context, res *runcmd.Result, resumed bool) error {
	code, msg, err := runcmd.PrintResumed(c.App.Writer, c.App.ErrWriter, res, c.Bool("json"), c.Duration("timeout"), resumed)
	if err == nil && !c.Bool("json") {
		io.WriteString(c.App.ErrWriter, runcmd.CallbackNote(res, c.Int("callback-conns")))
	}
	if err != nil || code == 0 {
		return err
	}
	return cli.Exit(msg, code)
}
