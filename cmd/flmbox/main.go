// Command flmbox runs untrusted Python and shell snippets in gVisor sandboxes
// on images cached on the local disk.
//
// This binary is small on purpose. A warm call, flmbox run --sandbox NAME,
// is the hot path of an agent's worker, and starting the whole CLI (image
// pulls over TLS, a registry, urfave/cli) costs about 2 ms per process: more
// than a shell snippet takes in a warm sandbox. So flmbox makes a plain warm
// call itself (warm.go) and execs flmbox-core, installed next to it, for
// every other command line, unchanged: same process, same stdio, same
// environment. flmbox-core implements all of flmbox, warm calls included. A
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
	"syscall"

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
	}
	err := execCore(os.Args)
	fmt.Fprintf(os.Stderr, "flmbox: %v\n", err)
	os.Exit(125)
}

// execCore replaces this process with flmbox-core and the same arguments; it
// returns only on failure.
func execCore(args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find %s: %w", coreName, err)
	}
	core := filepath.Join(filepath.Dir(self), coreName)
	if err := runcmd.SameBuild(core); err != nil {
		return fmt.Errorf("run %s: %w; install flmbox, flmbox-core and flmbox-agent of one build in one directory (make build puts them in bin/)", coreName, err)
	}
	err = syscall.Exec(core, args, os.Environ())
	return fmt.Errorf("run %s: %w; install flmbox, flmbox-core and flmbox-agent in one directory (make build puts them in bin/)", core, err)
}
