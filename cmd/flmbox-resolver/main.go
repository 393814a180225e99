// Command flmbox-resolver is an egress sandbox's DNS resolver: it runs on
// the host, one per sandbox, started and stopped by package sandbox
// (egress.Resolver). It answers only the names the sandbox's policy allows
// and pins the addresses it answers in the sandbox's nftables table (see
// package egress). It is two processes of egress.ResolverUser, both started
// from the executable they get as descriptor 4, each reading its
// configuration on its standard input: the guard (one argument, the
// configuration's file, which names it for people and for
// egress.Resolver.Stop), in the egress router's network namespace with
// CAP_NET_ADMIN only, which pins on the channel it gets as descriptor 3 and
// prints "ready" once the other answers (egress.Serve); and the DNS part
// (a second argument, "dns"), with no capability and a seccomp filter,
// which answers on the sockets it gets and writes only in the directory it
// gets (egress.Answer).
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
	os.NewFile(4, egress.ResolverName).Close() // its executable: it starts nothing
	return egress.Serve(ctx, cfg, os.NewFile(3, "pins"), func() {
		fmt.Println("ready")
		os.Stdout.Close()
	})
}
