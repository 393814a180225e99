// Command flmbox-resolver is an egress sandbox's DNS resolver: it runs on
// the host side, one per sandbox, started and stopped by package sandbox.
// It answers only the names the sandbox's policy allows and pins the
// addresses it answers in the sandbox's nftables table (see package
// egress). It is two processes: this one, started as egress.ResolverUser
// with CAP_NET_BIND_SERVICE and CAP_NET_ADMIN, binds port 53, keeps
// CAP_NET_ADMIN only, and starts itself again with one more argument
// ("dns") as the part that parses DNS, with no capability and a seccomp
// filter (egress.Serve, egress.Answer). It reads its configuration on its
// standard input (its one argument is the configuration's file, which
// names it for people and for egress.Resolver.Stop), writes only in the
// directory it gets as file descriptor 3, runs from the executable it gets
// as descriptor 4, and prints "ready" once it answers.
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
		name := egress.ResolverName
		if len(os.Args) == 3 {
			name = egress.DNSPartName
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	if len(os.Args) == 3 && os.Args[2] == egress.DNSPartArg {
		os.WriteFile("/proc/self/comm", []byte(egress.DNSPartName), 0)
		return egress.Answer(ctx, os.Stdin)
	}
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: %s CONFIG", egress.ResolverName)
	}
	// Started from a descriptor, its name is the descriptor's number.
	os.WriteFile("/proc/self/comm", []byte(egress.ResolverName), 0)
	var cfg egress.ResolverConfig
	if err := json.NewDecoder(os.Stdin).Decode(&cfg); err != nil {
		return fmt.Errorf("read the configuration: %w", err)
	}
	dir, exe := os.NewFile(3, os.Args[1]+" (directory)"), os.NewFile(4, egress.ResolverName)
	return egress.Serve(ctx, cfg, dir, exe, os.Args, func() {
		fmt.Println("ready")
		os.Stdout.Close()
	})
}
