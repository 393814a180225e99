package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/instance"
)

func instanceCommand() *cli.Command {
	return &cli.Command{
		Name:  "instance",
		Usage: "serve Flame's Instance service: one session is one sandbox, its tasks are snippets",
		Description: "Flame's executor starts flmbox instance with " + instance.EndpointEnv + " naming the Unix socket to serve on.\n" +
			"The sandbox flags are a session's defaults and the most it may ask for in its common_data.",
		Flags: append(sandboxFlags(), sandboxEnvFlag(),
			&cli.StringFlag{Name: "image", Usage: "image of sessions that name none (neither in their common_data nor their application)"},
			&cli.StringFlag{Name: "listen", EnvVars: []string{instance.EndpointEnv}, Usage: "the Unix socket to serve on (default: $" + instance.EndpointEnv + ")"},
			durationFlag("timeout", instance.DefaultTimeout, "a task's timeout when neither it nor its session sets one (flmexec has none)"),
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("instance takes no arguments, got %q", c.Args().Slice())
			}
			listen := c.String("listen")
			if listen == "" {
				return advise(fmt.Errorf("no socket to serve on"), "Flame's executor sets "+instance.EndpointEnv+"; to run it by hand, give --listen PATH")
			}
			spec, err := sandboxSpec(c)
			if err != nil {
				return err
			}
			// The socket first: a path in use, not a socket or too long is
			// refused before anything else is done or said to serve.
			ln, err := instance.Listen(listen)
			if err != nil {
				return err
			}
			m, err := openManager(c)
			if err != nil {
				ln.Close()
				return err
			}
			// What killed instances left (their owner is gone) goes while the
			// first session enters: Reconcile (a read of each record and of
			// runsc's state directory) leaves alone what a live process holds
			// or makes, as it does for any other flmbox running beside it.
			reconciled := make(chan struct{})
			go func() {
				defer close(reconciled)
				if err := m.Reconcile(c.Context); err != nil {
					fmt.Fprintf(c.App.ErrWriter, "flmbox instance: %v\n", err)
				}
			}()
			s := instance.New(m, instance.Options{Spec: spec, Timeout: c.Duration("timeout"), Log: c.App.ErrWriter})
			fmt.Fprintf(c.App.ErrWriter, "flmbox instance: serving on %s\n", listen)
			err = instance.Serve(c.Context, s, ln)
			<-reconciled
			return err
		},
	}
}
