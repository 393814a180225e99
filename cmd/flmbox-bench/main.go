// Command flmbox-bench is flmbox bench: it measures this worker, each
// figure beside its baseline (package bench). Its command line is flmbox
// bench's, global flags first:
//
//	flmbox-bench [--root DIR] [--runsc PATH] [--debug] bench [FLAGS]
//
// and users run it as flmbox bench: flmbox-core hands that command line,
// unparsed, to flmbox-bench installed next to it (flmbox, flmbox-core,
// flmbox-bench and flmbox-agent go in one directory). It prints, fails and
// exits as flmbox-core does (app.RunCommand).
//
// The bench is a binary of its own because it links test rigs that a
// shipped binary must not: an image registry, served on loopback to measure
// prewarm, and a Flame simulator (internal/testrig/flamesim) that drives
// flmbox instance as Flame's executor manager does. It measures the flmbox
// command next to it, as whole processes, and the same work through the Go
// API in process.
package main

import (
	"context"
	"os"

	"github.com/flmbox/flmbox/cmd/flmbox/app"
)

func main() {
	ctx, stop := app.NotifyContext(context.Background())
	code := app.RunCommand(ctx, os.Args, os.Stdout, os.Stderr, benchCommand())
	stop()
	os.Exit(code)
}
