package bench_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/flmbox/flmbox/bench"
)

// Measure this worker quickly, as `flmbox bench --quick --pause 20ms`
// does, with the binaries installed in /usr/local/bin, and print the table.
func ExampleRun() {
	o := bench.Defaults(true)
	o.Root = "/var/lib/flmbox"
	o.Flmbox = "/usr/local/bin/flmbox" // flmbox-agent is beside it
	o.Image = "python:3.12-slim"
	o.Pause = 20 * time.Millisecond
	o.Progress = os.Stderr
	rep, err := bench.Run(context.Background(), o)
	if err != nil {
		log.Fatal(err)
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		log.Fatal(err)
	}
}
