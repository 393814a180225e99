// Command flmbox-core is the flmbox CLI: every command of flmbox. The
// flmbox command runs warm calls itself and hands every other command line
// to flmbox-core, installed next to it (see cmd/flmbox).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/flmbox/flmbox/cmd/flmbox/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
