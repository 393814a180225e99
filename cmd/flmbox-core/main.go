// Command flmbox-core is the flmbox CLI: every command of flmbox. The
// flmbox command runs warm calls itself and hands every other command line
// to flmbox-core, installed next to it (see cmd/flmbox).
package main

import (
	"context"
	"os"

	"github.com/flmbox/flmbox/cmd/flmbox/app"
)

func main() {
	ctx, stop := app.NotifyContext(context.Background())
	code := app.Run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
