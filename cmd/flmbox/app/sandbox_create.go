package app

import (
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"
)

func sandboxCreateCommand() *cli.Command {
	return &cli.Command{
		Name:  "create",
		Usage: "create a persistent sandbox from IMAGE (taken from its pool if one is idle there) and print its name",
		Flags: append(sandboxFlags(), sandboxEnvFlag(),
			&cli.StringFlag{Name: "name", Usage: "the sandbox's name (default: generated)"},
			&cli.StringFlag{Name: "image", Usage: "image to run (prewarmed if needed; required)"},
			&cli.GenericFlag{Name: "label", Aliases: []string{"l"}, Value: &stringList{}, Usage: "set `K=V`, a label of yours to find the sandbox by (sandbox ls --filter label=K=V; repeatable)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("sandbox create takes no arguments, got %q", c.Args().Slice())
			}
			if err := required(c, "image"); err != nil {
				return err
			}
			spec, err := sandboxSpec(c)
			if err != nil {
				return err
			}
			spec.Name = c.String("name")
			if spec.Labels, err = labelsFlag(listFlag(c, "label")); err != nil {
				return err
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			sb, err := m.Acquire(c.Context, spec)
			if errors.Is(err, errdefs.ErrAlreadyExists) && spec.Name != "" {
				return advise(err, fmt.Sprintf("choose another name or remove it (flmbox sandbox rm %s)", spec.Name))
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, sb.Name)
			return nil
		},
	}
}
