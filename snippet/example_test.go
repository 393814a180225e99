package snippet_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/flmbox/flmbox/snippet"
	"github.com/flmbox/flmbox/snippet/wire"
)

// An agent runs a snippet directly.
func ExampleAgent_Run() {
	a := &snippet.Agent{Dir: os.TempDir()}
	res := a.Run(context.Background(), &wire.Request{
		Version:   wire.ProtocolVersion,
		Language:  wire.LanguageShell,
		Code:      "echo hello; exit 3",
		TimeoutMS: 5000,
	})
	fmt.Printf("exit %d: %s", res.ExitCode, res.Stdout.Data)
	// Output: exit 3: hello
}

// A client calls an agent that serves on a Unix socket, as flmbox run calls
// the agent of a sandbox.
func ExampleAgent_Serve() {
	dir, err := os.MkdirTemp("", "flmbox-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- (&snippet.Agent{Dir: dir}).Serve(ctx, ln) }()
	defer func() { stop(); <-served }()

	res, err := wire.Call(context.Background(), socket, &wire.Request{
		Version:   wire.ProtocolVersion,
		Language:  wire.LanguageShell,
		Code:      "printf '%s\\n' one two three; sleep 100",
		TimeoutMS: 2000, // ample time to print first, even on a busy machine
		MaxOutput: 8,
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("timed out %v, exit %d (%s), %d bytes written, kept %q and %q\n", res.TimedOut, res.ExitCode, res.Signal, res.Stdout.Total, res.Stdout.Data, res.Stdout.Tail)
	// Output:
	// timed out true, exit 137 (SIGKILL), 14 bytes written, kept "one\n" and "ree\n"
}
