package app

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

func pipcacheFetchCommand() *cli.Command {
	return &cli.Command{
		Name:      "fetch",
		Usage:     "download wheels with pip in a host-network sandbox of IMAGE (so they fit its Python) and add them to the cache",
		ArgsUsage: "REQUIREMENT...",
		Flags: append(pullFlags(),
			&cli.StringFlag{Name: "image", Usage: "image whose Python and platform the wheels must fit (prewarmed if needed; required)"},
			&cli.StringFlag{Name: "index-url", Usage: "package index `URL` (default: pip's, as the image configures it)"},
			durationFlag("timeout", 10*time.Minute, "give pip download this long"),
			&cli.StringFlag{Name: "max-download-size", Value: "2GiB", Usage: "refuse to download more than this (a tmpfs on the host holds the downloads)"},
			&cli.StringFlag{Name: "memory", Value: "1GiB", Usage: "memory limit of the sandbox"},
		),
		Action: func(c *cli.Context) error {
			if err := required(c, "image"); err != nil {
				return err
			}
			o, err := fetchOptionsFrom(c)
			if err != nil {
				return err
			}
			m, err := openManager(c)
			if err != nil {
				return err
			}
			wheels, err := m.FetchWheels(c.Context, c.Args().Slice(), o)
			if errors.Is(err, sandbox.ErrPip) {
				return advise(err, "check the requirements, the index (--index-url) and the network the sandbox reaches")
			}
			if err != nil {
				return err
			}
			printAdded(c, wheels)
			return nil
		},
	}
}

func fetchOptionsFrom(c *cli.Context) (o sandbox.FetchOptions, err error) {
	if c.NArg() == 0 {
		return o, fmt.Errorf("pipcache fetch needs at least one REQUIREMENT")
	}
	o = sandbox.FetchOptions{IndexURL: c.String("index-url"), Timeout: c.Duration("timeout"),
		Sandbox: sandbox.Spec{Image: c.String("image")}}
	if o.MaxDownloadBytes, err = parseSize("--max-download-size", c.String("max-download-size")); err != nil {
		return o, err
	}
	if o.Sandbox.Limits.MemoryBytes, err = parseSize("--memory", c.String("memory")); err != nil {
		return o, err
	}
	if o.Sandbox.Pull, err = pullOptions(c); err != nil {
		return o, err
	}
	return o, nil
}
