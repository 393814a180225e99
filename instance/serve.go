package instance

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"

	"github.com/flmbox/flmbox/instance/flamepb"
	"github.com/flmbox/flmbox/sandbox"
)

// EndpointEnv names the Unix socket that Flame's executor gives an
// application to serve on.
const EndpointEnv = "FLAME_INSTANCE_ENDPOINT"

// maxTaskInput bounds a call's message: a task's input with the largest code
// (JSON-escaped) and the largest stdin (as numbers, up to 4 bytes each).
// gRPC's default, 4 MiB, would refuse some that the agent takes.
const maxTaskInput = 6*sandbox.MaxCodeSize + 4*sandbox.MaxStdinSize + 1<<20

// Serve serves s over gRPC on ln (see Listen) until ctx is done: then it
// stops taking calls, cancels the task running (its snippet is killed),
// leaves the session (its sandbox is removed) and returns nil. It closes
// ln: a Listener's socket file goes with it.
func Serve(ctx context.Context, s *Server, ln net.Listener) error {
	defer ln.Close() // also when gRPC closed it: Listener.Close may be called again
	path := ln.Addr().String()
	g := grpc.NewServer(grpc.MaxRecvMsgSize(maxTaskInput))
	flamepb.RegisterInstanceServer(g, s)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-served:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.Leave(context.WithoutCancel(ctx))
			return fmt.Errorf("serve on %s: %w", path, err)
		}
	}
	g.Stop() // cancels the calls running
	return s.Leave(context.WithoutCancel(ctx))
}
