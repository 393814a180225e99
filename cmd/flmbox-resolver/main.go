// Command flmbox-resolver is an egress sandbox's DNS resolver: it runs on
// the host side, one per sandbox, started and stopped by package sandbox.
// It answers only the names the sandbox's policy allows and pins the
// addresses it answers in the sandbox's nftables table (see package
// egress). It reads its configuration on its standard input (its one
// argument is the configuration's file, which names it for people and for
// egress.Resolver.Stop), writes only in the directory it gets as file
// descriptor 3, and prints "ready" once it listens. It runs as
// egress.ResolverUID with CAP_NET_BIND_SERVICE and CAP_NET_ADMIN only.
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
	// Started from a descriptor, its name is the descriptor's number.
	os.WriteFile("/proc/self/comm", []byte(egress.ResolverName), 0)
	var cfg egress.ResolverConfig
	if err := json.NewDecoder(os.Stdin).Decode(&cfg); err != nil {
		return fmt.Errorf("read the configuration: %w", err)
	}
	dir := os.NewFile(3, os.Args[1]+" (directory)")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	return egress.Serve(ctx, cfg, dir, func() {
		fmt.Println("ready")
		os.Stdout.Close()
	})
}
