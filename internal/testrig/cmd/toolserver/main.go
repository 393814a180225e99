// Command toolserver is the host end of demo 3's callbacks: a tool server
// with two tools and canned answers, listening on a Unix socket, which a
// snippet in a --network none sandbox reaches through flmbox run's
// --callback (demo/demo3.py is that snippet).
//
// Usage:
//
//	toolserver -listen PATH [-max-request BYTES] [-timeout DURATION]
//
// It removes a stale socket at PATH first (and refuses to replace anything
// else, or a socket a server still listens on), prints
// "toolserver: listening on PATH" once it accepts, and serves until SIGINT
// or SIGTERM; then it removes its socket, prints
// "toolserver: served N calls (search K, weather W), E errors" and exits 0.
// N counts the calls answered with a result, E the requests answered with
// {"error"} (whether or not the client was still there to read it); "1 call"
// and "1 error" are singular. Each error is also a line on stderr.
//
// The protocol is Hermes Agent's execute_code RPC, one call per connection:
// the client sends one JSON object, {"tool": NAME, "args": {...}}, ended by
// a newline or by the end of its stream (a half-close); the server answers
// one JSON line and closes the connection. Other keys of the request (Hermes
// sends "token") are ignored. The tools:
//
//	search  {"query": "..."}  {"query", "results": [{"title", "url"}, ...3]}
//	weather {"city": "..."}   {"city", "temp_c", "conditions"}
//
// Answers depend on the arguments only. An unknown tool, bad JSON, bad args,
// an empty request, a request over -max-request (1 MiB) or one not received
// within -timeout (30 s, the bound of a connection's whole life) is answered
// {"error": "..."}.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/flmbox/flmbox/instance"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "toolserver: %v\n", err)
		os.Exit(1)
	}
}

// Defaults of a request's bounds.
const (
	defaultMaxRequest = 1 << 20
	defaultTimeout    = 30 * time.Second
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("toolserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("listen", "", "the Unix socket to listen on (required)")
	maxRequest := fs.Int64("max-request", defaultMaxRequest, "the largest request, in bytes")
	timeout := fs.Duration("timeout", defaultTimeout, "the longest a connection may take")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: toolserver -listen PATH [-max-request BYTES] [-timeout DURATION]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *path == "":
		fs.Usage()
		return errors.New("no socket to listen on: give -listen PATH")
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	case *maxRequest <= 0 || *timeout <= 0:
		return errors.New("-max-request and -timeout must be positive")
	}

	ln, err := instance.Listen(*path) // flmbox instance's: a stale socket replaced, a live one refused
	if err != nil {
		return err
	}
	defer ln.Close() // waits for serve's Close, which removes the socket
	s := newServer(*maxRequest, *timeout, func(format string, args ...any) {
		fmt.Fprintf(stderr, "toolserver: "+format+"\n", args...)
	})
	fmt.Fprintf(stdout, "toolserver: listening on %s\n", *path)
	err = s.serve(ctx, ln)
	fmt.Fprintf(stdout, "toolserver: %s\n", s.summary())
	return err
}
