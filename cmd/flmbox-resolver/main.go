// Command flmbox-resolver is an egress sandbox's DNS resolver: it runs on
// the host side, one per sandbox, started and stopped by package sandbox.
// It answers only the names the sandbox's policy allows and pins the
// addresses it answers in the sandbox's nftables table (see package
// egress). Its one argument is its configuration file; it prints "ready"
// once it listens.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/flmbox/flmbox/egress"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "flmbox-resolver: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: flmbox-resolver CONFIG")
	}
	b, err := os.ReadFile(os.Args[1])
	if err != nil {
		return err
	}
	var cfg egress.ResolverConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("read %s: %w", os.Args[1], err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	return egress.Serve(ctx, cfg, func() {
		fmt.Println("ready")
		os.Stdout.Close()
	})
}
