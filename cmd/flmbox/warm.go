package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// warmCall is a plain `flmbox run --sandbox NAME` command line, or a plain
// `flmbox run --image IMAGE` (pool.go).
type warmCall struct {
	root, runsc, sandbox string
	image, tmpSize       string // --image and --tmp-size as given
	batch                string // --batch FILE
	parallel             int
	language             string
	code, file           string // -c CODE or FILE
	hasCode              bool
	timeout              time.Duration
	maxOutput            int64
	reset, json          bool
	env                  []string // -e K=V, the call's
}

// warmFlags are the flags of table marked Warm.
func warmFlags(table []runcmd.Flag) []runcmd.Flag {
	var out []runcmd.Flag
	for _, f := range table {
		if f.Warm {
			out = append(out, f)
		}
	}
	return out
}

var (
	globalWarmFlags = warmFlags(runcmd.GlobalFlags)
	runWarmFlags    = warmFlags(runcmd.RunFlags)
	runPooledFlags  = withPooled(warmFlags(runcmd.RunFlags))
	runBatchFlags   = withBatch(warmFlags(runcmd.RunFlags))
)

// withPooled adds to flags those of a plain run --image: --image, and
// --tmp-size, whose value is taken as given (flmbox-core reads it).
func withPooled(flags []runcmd.Flag) []runcmd.Flag {
	for _, f := range runcmd.RunFlags {
		if f.Name == "image" {
			flags = append(flags, f)
		}
	}
	return append(flags, runcmd.Flag{Name: "tmp-size", Kind: runcmd.String})
}

// parseWarmCall recognizes the command lines that flmbox runs itself: run
// --sandbox NAME with (-c CODE | FILE) and only the flags runcmd's tables
// mark Warm, global ones before run, run's before or after FILE, read by
// the parser flmbox-core reads them with (urfave/cli, after
// runcmd.HoistFlags). It returns false for anything else (other commands
// or flags, a flag in two forms, code on stdin, help, a global flag set
// only through its environment variable), which flmbox-core then runs or
// refuses. A Size is taken here only as a
// plain number of bytes; sizes such as 1MiB are flmbox-core's to parse.
func parseWarmCall(args []string, lookupEnv func(string) (string, bool)) (*warmCall, bool) {
	w, ok := parseRun(args, lookupEnv, runWarmFlags)
	if !ok || w.sandbox == "" {
		return nil, false
	}
	w.runsc = "" // a call to a running sandbox needs none
	return w, true
}

// parsePooledCall recognizes the command lines that flmbox serves from a
// warm pool itself (pool.go): run --image IMAGE with (-c CODE | FILE),
// perhaps --tmp-size, and otherwise only what parseWarmCall takes but
// --sandbox and --reset.
func parsePooledCall(args []string, lookupEnv func(string) (string, bool)) (*warmCall, bool) {
	w, ok := parseRun(args, lookupEnv, runPooledFlags)
	if !ok || w.image == "" || w.sandbox != "" || w.reset {
		return nil, false // flmbox-core's to run, or to refuse
	}
	return w, true
}

// errNotWarm is the parse's failure for a command line that is not a run.
var errNotWarm = errors.New("not a warm call")

// parseRun reads a run command line whose run flags are all of known, as
// parseWarmCall describes: with urfave/cli, as flmbox-core reads it
// (runcmd.HoistFlags, then the parse), every value then checked by set.
func parseRun(args []string, lookupEnv func(string) (string, bool), known []runcmd.Flag) (*warmCall, bool) {
	w := &warmCall{}
	for _, table := range [][]runcmd.Flag{runcmd.GlobalFlags, runcmd.RunFlags} {
		for _, f := range table {
			if f.Warm && f.Default != "" && !w.set(f.Name, f.Default) {
				panic("flag --" + f.Name + ": its default is not a warm call's value")
			}
		}
	}
	for _, f := range runcmd.GlobalFlags {
		for _, env := range f.EnvVars {
			v, ok := lookupEnv(env)
			switch {
			case !ok || (!f.Warm && v == ""):
			case !f.Warm:
				return nil, false // flmbox-core's to read (and to refuse if it is bad)
			case !w.set(f.Name, v):
				return nil, false
			}
		}
	}
	var positional []string
	ran := false
	refuse := func(_ *cli.Context, err error, _ bool) error { return err }
	app := &cli.App{
		Name: "flmbox", HideHelp: true, HideHelpCommand: true, HideVersion: true,
		Writer: io.Discard, ErrWriter: io.Discard, ExitErrHandler: func(*cli.Context, error) {}, OnUsageError: refuse,
		DisableSliceFlagSeparator: true, // -e K=x,y is one value
		Flags:                     cliFlags(globalWarmFlags),
		Before:                    func(c *cli.Context) error { return w.read(c, globalWarmFlags) },
		Action:                    func(*cli.Context) error { return errNotWarm }, // no command, or another
		Commands: []*cli.Command{{
			Name: "run", HideHelp: true, OnUsageError: refuse, Flags: cliFlags(known),
			Action: func(c *cli.Context) error {
				positional, ran = c.Args().Slice(), true
				return w.read(c, known)
			},
		}},
	}
	if err := app.Run(runcmd.HoistFlags(app, append([]string{"flmbox"}, args...))); err != nil || !ran {
		return nil, false
	}
	switch {
	case w.root == "":
		return nil, false // an empty root is flmbox-core's to refuse
	case w.hasCode && len(positional) == 0:
	case w.batch != "" && len(positional) == 0: // its codes are FILE's
	case !w.hasCode && len(positional) == 1 && positional[0] != "-":
		w.file = positional[0]
	default:
		return nil, false
	}
	return w, true
}

// cliFlags are urfave/cli's flags for table as the warm-call parser reads
// them: each value as written (set checks it), a list's values whole.
func cliFlags(table []runcmd.Flag) []cli.Flag {
	var out []cli.Flag
	for _, f := range table {
		switch f.Kind {
		case runcmd.Bool:
			out = append(out, &cli.BoolFlag{Name: f.Name, Aliases: f.Aliases})
		case runcmd.List:
			out = append(out, &cli.StringSliceFlag{Name: f.Name, Aliases: f.Aliases})
		default:
			out = append(out, &cli.StringFlag{Name: f.Name, Aliases: f.Aliases})
		}
	}
	return out
}

// read sets the flags of table given on c's command line.
func (w *warmCall) read(c *cli.Context, table []runcmd.Flag) error {
	for _, f := range table {
		if !c.IsSet(f.Name) {
			continue
		}
		var values []string
		switch f.Kind {
		case runcmd.Bool:
			values = []string{strconv.FormatBool(c.Bool(f.Name))}
		case runcmd.List:
			values = c.StringSlice(f.Name)
		default:
			values = []string{c.String(f.Name)}
		}
		for _, v := range values {
			if !w.set(f.Name, v) {
				return errNotWarm
			}
		}
	}
	return nil
}

// set sets the flag named name (not an alias) to value; false if value is
// not one a warm call takes for it.
func (w *warmCall) set(name, value string) bool {
	switch name {
	case "root":
		// Absolute, as the library makes it (sandbox.Open): the records
		// read and the command line handed on name the same root.
		w.root = value
		if value != "" {
			root, err := filepath.Abs(value)
			if err != nil {
				return false
			}
			w.root = root
		}
	case "runsc": // pool.go passes it on
		w.runsc = value
	case "sandbox":
		w.sandbox = value
	case "image":
		w.image = value
	case "tmp-size":
		w.tmpSize = value
	case "batch":
		w.batch = value
	case "parallel":
		return w.setParallel(value)
	case "language":
		w.language = value
	case "code":
		w.code, w.hasCode = value, true
	case "timeout":
		d, err := time.ParseDuration(value)
		if err != nil {
			return false
		}
		w.timeout = d
	case "max-output":
		if value == runcmd.DefaultMaxOutput {
			w.maxOutput = wire.DefaultMaxOutput
			return true
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n <= 0 || strings.TrimLeft(value, "0123456789") != "" {
			return false
		}
		w.maxOutput = n
	case "env":
		// PYTHONPATH is flmbox-core's: package sandbox keeps the sandbox's
		// site-packages first on it (sandbox.Request.Env).
		if strings.HasPrefix(value, "PYTHONPATH=") {
			return false
		}
		w.env = append(w.env, value)
	case "reset", "json":
		b, err := strconv.ParseBool(value)
		if err != nil {
			return false
		}
		if name == "reset" {
			w.reset = b
		} else {
			w.json = b
		}
	default:
		return false
	}
	return true
}

// run makes the call and prints its result as flmbox-core would. handled is
// false when the call failed before its request was sent (a bad request,
// no such sandbox, one not running, or an agent that does not answer): the
// caller then hands the command line to flmbox-core, which says why.
// Once the request is sent, every failure is reported here, by the same
// client (package record) and words (package runcmd) as flmbox-core's: the
// agent may have run the snippet, so it is never sent again.
func (w *warmCall) run(ctx context.Context, stdout, stderr io.Writer) (code int, handled bool) {
	req, ok := w.request()
	if !ok {
		return 0, false
	}
	rec, err := record.Read(w.root, w.sandbox)
	if err != nil || rec.Callable() != nil {
		return 0, false
	}
	conn, err := rec.Dial(ctx)
	if err != nil && ctx.Err() != nil {
		return runcmd.InterruptStatus(ctx), true // interrupted before the call: nothing to run, nothing to say
	}
	if err != nil {
		return 0, false // dead, or its socket replaced
	}
	defer conn.Close()
	return w.finish(ctx, rec, conn, req, stdout, stderr)
}

// request is the call's request; false if flmbox-core must read its code
// or refuse it.
func (w *warmCall) request() (*wire.Request, bool) {
	req := &wire.Request{Version: wire.ProtocolVersion, Language: w.language, Code: w.code,
		TimeoutMS: w.timeout.Milliseconds(), MaxOutput: w.maxOutput, Reset: w.reset, Env: w.env}
	if w.file != "" {
		code, ok := readRegularFile(w.file)
		if !ok {
			return nil, false
		}
		// Run as a file of FILE's name, as python3 FILE runs it.
		req.Code, req.File = code, filepath.Base(w.file)
	}
	return req, req.Validate() == nil
}

// finish makes the call on conn and prints its result.
func (w *warmCall) finish(ctx context.Context, rec *record.Record, conn *os.File, req *wire.Request, stdout, stderr io.Writer) (code int, handled bool) {
	res, err := rec.CallConn(ctx, conn, req)
	if errors.Is(err, wire.ErrInterrupted) {
		// Ctrl-C: what the snippet printed until then, and 130 (143 for
		// SIGTERM), as flmbox-core does.
		code, err := runcmd.PrintInterrupted(ctx, stdout, stderr, runcmd.FromWire(res), w.json)
		if err != nil {
			fmt.Fprintf(stderr, "flmbox: %s\n", err)
		}
		return code, true
	}
	if err != nil {
		fmt.Fprintf(stderr, "flmbox: %s\n", err)
		if h := runcmd.CallHint(err, w.sandbox); h != "" {
			fmt.Fprintf(stderr, "flmbox: %s\n", h)
		}
		return runcmd.ExitFlmboxFailed, true
	}
	code, msg, err := runcmd.Print(stdout, stderr, runcmd.FromWire(res), w.json, w.timeout)
	if err != nil {
		msg, code = err.Error(), runcmd.ExitFlmboxFailed
	}
	if msg != "" {
		fmt.Fprintf(stderr, "flmbox: %s\n", msg)
	}
	return code, true
}

// readRegularFile reads the code in path if it is a regular file. Anything
// else (a pipe, /dev/stdin, a FIFO) could be read only once: flmbox-core
// reads it instead.
func readRegularFile(path string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return "", false
	}
	return string(b), true
}
