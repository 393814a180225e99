// Command flmbox runs untrusted Python and shell snippets in gVisor sandboxes
// on images cached on the local disk.
//
// This binary is small on purpose. A warm call, flmbox run --sandbox NAME,
// is the hot path of an agent's worker, and starting the whole CLI (image
// pulls over TLS, a registry, gRPC) costs milliseconds per process: more
// than a shell snippet takes in a warm sandbox. So flmbox makes a plain warm
// call itself (warm.go), serves a plain run --image from a warm pool
// (pool.go), runs a batch in a running sandbox (batch.go), and execs flmbox-core, installed next to it, for every other
// command line, unchanged: same process, same stdio, same environment. flmbox-core implements all of flmbox, warm calls included. A
// call is handed over too whenever anything goes wrong before its request is
// sent (no such sandbox, a dead one, a bad flag), so that flmbox-core says
// what is wrong: nothing has run by then. Before handing over, flmbox checks
// that flmbox-core is of its own build (a mismatch exits 125).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
)

// coreName is the binary that implements every command, next to flmbox.
const coreName = "flmbox-core"

func main() {
	if call, ok := parseWarmCall(os.Args[1:], os.LookupEnv); ok {
		ctx, stop := runcmd.NotifyContext(context.Background())
		code, handled := call.run(ctx, os.Stdout, os.Stderr)
		stop()
		if handled {
			os.Exit(code)
		}
	} else if call, ok := parsePooledCall(os.Args[1:], os.LookupEnv); ok {
		if err := pooled(call); err != nil {
			fmt.Fprintf(os.Stderr, "flmbox: %v\n", err)
			os.Exit(125)
		}
	} else if call, ok := parseBatchCall(os.Args[1:], os.LookupEnv); ok {
		ctx, stop := runcmd.NotifyContext(context.Background())
		code, handled := call.runBatch(ctx, os.Stdout, os.Stderr)
		stop()
		if handled {
			os.Exit(code)
		}
	}
	core, err := findCore()
	if err == nil {
		err = execArgs(core, os.Args)
	}
	fmt.Fprintf(os.Stderr, "flmbox: %v\n", err)
	os.Exit(125)
}

// pooled runs a plain run --image from a warm pool (pool.go) and execs
// flmbox-core to give its sandbox back. It returns nil, having done
// nothing, if flmbox-core must run the command line, and an error only if
// flmbox-core could not be run to give the sandbox back (Reconcile removes
// it: its owner, this process, is gone then).
func pooled(call *warmCall) error {
	core, err := findCore()
	if err != nil {
		return nil // the handover's check fails again and says so
	}
	ctx, stop := runcmd.NotifyContext(context.Background())
	defer stop()
	back, ok := call.runPooled(ctx, core, os.Stdout, os.Stderr)
	if !ok {
		return nil
	}
	return execArgs(core, call.giveBackArgs(back))
}

// findCore returns flmbox-core, next to flmbox, once it is known to be of
// this build.
func findCore() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find %s: %w", coreName, err)
	}
	core := filepath.Join(filepath.Dir(self), coreName)
	if err := runcmd.SameBuild(core); err != nil {
		return "", fmt.Errorf("run %s: %w; install flmbox, flmbox-core and flmbox-agent of one build in one directory (make build puts them in bin/)", coreName, err)
	}
	return core, nil
}
