package main

import (
	"fmt"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/rootfs"
)

// pullFlags select and bound what an image pull fetches.
func pullFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "platform", Usage: "platform to pull, os/arch[/variant] (default: this worker's)"},
		&cli.BoolFlag{Name: "offline", Usage: "never contact a registry: resolve tags from their last resolution"},
		&cli.StringSliceFlag{Name: "insecure-registry", Usage: "registry `HOST[:PORT]` that may be reached over plain HTTP (loopback always may)"},
		&cli.StringFlag{Name: "max-unpacked-size", Value: "16GiB", Usage: "refuse images whose layers unpack to more than this"},
	}
}

// pullOptions reads pullFlags.
func pullOptions(c *cli.Context) (*rootfs.PullOptions, error) {
	o := &rootfs.PullOptions{
		Offline:            c.Bool("offline"),
		InsecureRegistries: c.StringSlice("insecure-registry"),
		Unpack:             rootfs.UnpackOptions{Warnf: func(f string, a ...any) { warnf(c, f, a...) }},
	}
	if p := c.String("platform"); p != "" {
		pl, err := rootfs.ParsePlatform(p)
		if err != nil {
			return nil, err
		}
		o.Platform = pl
	}
	n, err := units.RAMInBytes(c.String("max-unpacked-size"))
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("--max-unpacked-size %q: want a size such as 16GiB or 512m", c.String("max-unpacked-size"))
	}
	o.Unpack.MaxBytes = n
	return o, nil
}

// jsonFlag makes a command print JSON.
var jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON"}
