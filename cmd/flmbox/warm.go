package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flmbox/flmbox/internal/warmcall"
	"github.com/flmbox/flmbox/snippet/wire"
)

// warmCall is a plain `flmbox run --sandbox NAME` command line.
type warmCall struct {
	root, sandbox, language string
	code, file              string // -c CODE or FILE
	hasCode                 bool
	timeout                 time.Duration
	maxOutput               int64
	reset, json             bool
}

// parseWarmCall recognizes the command lines that flmbox runs itself:
//
//	flmbox [--root DIR] [--runsc PATH] run --sandbox NAME [--language L]
//	    [--timeout D] [--max-output BYTES] [--reset] [--json] (-c CODE | FILE)
//
// with flags written as -f, --f, -f=V or --f=V, run's flags before or after
// FILE, and "--" ending them, as flmbox-core reads them. It returns false for
// anything else (other commands or flags, code on stdin, help), which
// flmbox-core then runs. --max-output is taken here only as a plain number
// of bytes; sizes such as 1MiB are flmbox-core's to parse.
func parseWarmCall(args []string, lookupEnv func(string) (string, bool)) (*warmCall, bool) {
	w := &warmCall{root: warmcall.DefaultRoot, language: wire.LanguagePython, timeout: 30 * time.Second, maxOutput: wire.DefaultMaxOutput}
	if r, ok := lookupEnv("FLMBOX_ROOT"); ok {
		w.root = r // set, even empty, it is flmbox-core's root
	}
	if d, _ := lookupEnv("FLMBOX_DEBUG"); d != "" {
		return nil, false // flmbox-core's to read (and to refuse if it is not a boolean)
	}
	// Global flags, up to the command.
	for {
		if len(args) == 0 {
			return nil, false
		}
		name, value, rest, ok := nextFlag(args, map[string]bool{"root": true, "runsc": true})
		if !ok {
			break
		}
		if name == "root" {
			w.root = value
		}
		args = rest
	}
	if args[0] != "run" {
		return nil, false
	}
	args = args[1:]
	var positional []string
	takesValue := map[string]bool{"sandbox": true, "language": true, "l": true, "timeout": true, "code": true, "c": true, "max-output": true, "reset": false, "json": false}
	for len(args) > 0 {
		if args[0] == "--" {
			if len(positional) > 0 {
				return nil, false // flmbox-core counts a "--" after FILE as an argument
			}
			positional = append(positional, args[1:]...)
			break
		}
		if !strings.HasPrefix(args[0], "-") || args[0] == "-" {
			positional = append(positional, args[0])
			args = args[1:]
			continue
		}
		name, value, rest, ok := nextFlag(args, takesValue)
		if !ok {
			return nil, false
		}
		args = rest
		if !w.set(name, value) {
			return nil, false
		}
	}
	switch {
	case w.sandbox == "":
		return nil, false
	case w.hasCode && len(positional) == 0:
	case !w.hasCode && len(positional) == 1 && positional[0] != "-":
		w.file = positional[0]
	default:
		return nil, false
	}
	return w, true
}

// set sets flag name of run to value; false if value is not valid for it.
func (w *warmCall) set(name, value string) bool {
	switch name {
	case "sandbox":
		w.sandbox = value
	case "language", "l":
		w.language = value
	case "code", "c":
		w.code, w.hasCode = value, true
	case "timeout":
		d, err := time.ParseDuration(value)
		if err != nil {
			return false
		}
		w.timeout = d
	case "max-output":
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n <= 0 || strings.TrimLeft(value, "0123456789") != "" {
			return false
		}
		w.maxOutput = n
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
	}
	return true
}

// nextFlag reads the flag at args[0] if it is one of known (name → takes a
// value), with its value ("true" for a boolean written alone), and returns
// the arguments after it.
func nextFlag(args []string, known map[string]bool) (name, value string, rest []string, ok bool) {
	a := args[0]
	if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
		return "", "", nil, false
	}
	name = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	name, value, hasValue := strings.Cut(name, "=")
	takes, isKnown := known[name]
	switch {
	case !isKnown:
		return "", "", nil, false
	case hasValue:
		return name, value, args[1:], true
	case !takes:
		return name, "true", args[1:], true
	case len(args) < 2:
		return "", "", nil, false
	}
	return name, args[1], args[2:], true
}

// run makes the call and prints its result as flmbox-core would. handled is
// false when the call failed before its request was sent, or because the
// agent hung up (then with warmcall.HungUpEnv set, so that flmbox-core
// explains without calling again): the caller then hands the command line to
// flmbox-core, which explains the failure.
func (w *warmCall) run(ctx context.Context, stdout, stderr io.Writer) (code int, handled bool) {
	req := &wire.Request{Version: wire.ProtocolVersion, Language: w.language, Code: w.code,
		TimeoutMS: w.timeout.Milliseconds(), MaxOutput: w.maxOutput, Reset: w.reset}
	if w.file != "" {
		code, ok := readRegularFile(w.file)
		if !ok {
			return 0, false
		}
		req.Code = code
	}
	if req.Validate() != nil {
		return 0, false
	}
	sb, err := warmcall.Open(w.root, w.sandbox)
	if err != nil {
		return 0, false
	}
	req.Limits = warmcall.SnippetLimits(sb.Limits.MemoryBytes, sb.Limits.Pids)
	warmcall.Touch(sb.Dir)
	conn, err := wire.Dial(ctx, warmcall.SocketPath(sb.Dir))
	if err != nil {
		return 0, false // dead, or its socket replaced
	}
	defer conn.Close()
	res, err := wire.CallConn(ctx, conn, req)
	if errors.Is(err, wire.ErrHungUp) && ctx.Err() == nil {
		// The agent may have run the snippet: flmbox-core only explains
		// (the sandbox died, most likely), told so by HungUpEnv.
		os.Setenv(warmcall.HungUpEnv, err.Error())
		return 0, false
	}
	if err != nil {
		fmt.Fprintf(stderr, "flmbox: %s\n", err)
		return warmcall.ExitFlmboxFailed, true
	}
	code, msg, err := warmcall.Print(stdout, stderr, res, w.json, w.timeout)
	if err != nil {
		msg, code = err.Error(), warmcall.ExitFlmboxFailed
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
