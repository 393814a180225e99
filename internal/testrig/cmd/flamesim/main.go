// Command flamesim runs demo 1 as Flame runs it: it starts COMMAND, a
// `flmbox instance`, as Flame's executor manager starts an application
// (package flamesim), enters one session, runs demo 1's three steps as its
// tasks (a shell snippet writes /tmp/demo/sales.csv, demo/demo1.py sums it
// up, a shell snippet prints /tmp/demo/summary.json), leaves the session
// and stops the process with SIGTERM.
//
// Usage:
//
//	flamesim [-demo1 FILE] COMMAND [ARG...]
//
// e.g. flamesim bin/flmbox --root /var/lib/flmbox instance --image IMAGE
// (`make demo` runs it so). Each task's stdout (its output's data) and exit
// code are printed, the instance's log goes to stderr. The exit status is 1
// if anything failed: the instance's start, a call, a task's exit code, or
// the instance's exit after SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/flmbox/flmbox/internal/testrig/flamesim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "flamesim: %v\n", err)
		os.Exit(1)
	}
}

// The bounds of the instance's start and of its exit after SIGTERM.
const (
	startTimeout = time.Minute
	stopGrace    = 30 * time.Second
)

// session is the session's ID.
const session = "demo1"

// task is one step of demo 1.
type task struct {
	what, language, code string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("flamesim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	demo1 := fs.String("demo1", "demo/demo1.py", "demo 1's Python script")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: flamesim [-demo1 FILE] COMMAND [ARG...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("no command to run: give the flmbox instance command line")
	}
	code, err := os.ReadFile(*demo1)
	if err != nil {
		return err
	}
	tasks := []task{
		{"write /tmp/demo/sales.csv", "shell", `mkdir -p /tmp/demo && printf "region,revenue,cost\neast,120,75\nwest,80,55\neast,150,90\nwest,100,70\n" > /tmp/demo/sales.csv`},
		{*demo1, "python", string(code)},
		{"cat /tmp/demo/summary.json", "shell", "cat /tmp/demo/summary.json; echo"},
	}

	dir, err := os.MkdirTemp("", "flamesim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	start := time.Now()
	e, err := flamesim.Start(startCtx, fs.Arg(0), fs.Args()[1:], flamesim.Options{Dir: dir, Stdout: stderr, Stderr: stderr})
	if err != nil {
		return err
	}
	say := func(format string, args ...any) { fmt.Fprintf(stdout, "flamesim: "+format+"\n", args...) }
	say("started %s (pid %d); its socket answered after %s", fs.Arg(0), e.Pid(), since(start))
	defer func() {
		start := time.Now()
		if serr := e.Stop(stopGrace); serr != nil {
			err = errors.Join(err, fmt.Errorf("after SIGTERM: %w", serr))
			return
		}
		say("SIGTERM: the instance exited 0 (%s)", since(start))
	}()

	start = time.Now()
	res, err := e.Enter(ctx, session, "", nil)
	if err == nil {
		err = flamesim.Check(res)
	}
	if err != nil {
		return fmt.Errorf("enter session %q: %w", session, err)
	}
	say("OnSessionEnter %q: ok (%s)", session, since(start))
	for i, t := range tasks {
		id := fmt.Sprint(i + 1)
		start := time.Now()
		res, err := e.Invoke(ctx, id, flamesim.Script(t.language, t.code))
		if err != nil {
			return err
		}
		out, err := flamesim.DecodeOutput(res)
		if err != nil {
			return fmt.Errorf("task %s: %w", id, err)
		}
		say("task %s (%s, %s): exit %d (%s)%s", id, t.language, t.what, out.ExitCode, since(start), outputNote(out))
		stdout.Write(out.Data)
		if len(out.Data) > 0 && out.Data[len(out.Data)-1] != '\n' {
			fmt.Fprintln(stdout)
		}
		if out.Stderr != "" {
			fmt.Fprintf(stdout, "stderr: %s\n", strings.TrimRight(out.Stderr, "\n"))
		}
		if out.ExitCode != 0 || out.TimedOut {
			return fmt.Errorf("task %s (%s) failed: exit %d", id, t.what, out.ExitCode)
		}
	}
	start = time.Now()
	if res, err = e.Leave(ctx); err == nil {
		err = flamesim.Check(res)
	}
	if err != nil {
		return fmt.Errorf("leave session %q: %w", session, err)
	}
	say("OnSessionLeave: ok (%s)", since(start))
	return nil
}

// outputNote says what a task's output is, if not its stdout below.
func outputNote(out *flamesim.Output) string {
	switch {
	case out.TimedOut:
		return ", timed out"
	case len(out.Data) == 0:
		return ", no output"
	}
	return ", data:"
}

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }
