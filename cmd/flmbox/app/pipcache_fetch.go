package app

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/runtime"
)

// fetchMount is where pip download writes in the fetch sandbox: the
// cache's inbox, a bounded tmpfs on the host.
const fetchMount = "/dev/.flmbox/fetch"

// fetchOptions is what pipcache fetch downloads, and how.
type fetchOptions struct {
	reqs        []string
	indexURL    string
	timeout     time.Duration
	maxDownload int64
	sandbox     sandboxOptions
}

func pipcacheFetchCommand() *cli.Command {
	return &cli.Command{
		Name:      "fetch",
		Usage:     "download wheels with pip in a host-network sandbox of IMAGE (so they fit its Python) and add them to the cache",
		ArgsUsage: "REQUIREMENT...",
		Flags: append(pullFlags(),
			&cli.StringFlag{Name: "image", Required: true, Usage: "image whose Python and platform the wheels must fit (prewarmed if needed)"},
			&cli.StringFlag{Name: "index-url", Usage: "package index `URL` (default: pip's, as the image configures it)"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "give pip download this long"},
			&cli.StringFlag{Name: "max-download-size", Value: "2GiB", Usage: "refuse to download more than this (a tmpfs on the host holds the downloads)"},
			&cli.StringFlag{Name: "memory", Value: "1GiB", Usage: "memory limit of the sandbox"},
		),
		Action: func(c *cli.Context) error {
			o, err := fetchOptionsFrom(c)
			if err != nil {
				return err
			}
			wheels, err := fetchWheels(c.Context, c, o)
			if err != nil {
				return err
			}
			printAdded(c, wheels)
			return nil
		},
	}
}

func fetchOptionsFrom(c *cli.Context) (o fetchOptions, err error) {
	o = fetchOptions{reqs: c.Args().Slice(), indexURL: c.String("index-url"), timeout: c.Duration("timeout")}
	if len(o.reqs) == 0 {
		return o, fmt.Errorf("pipcache fetch needs at least one REQUIREMENT")
	}
	if err := checkRequirements(o.reqs); err != nil {
		return o, err
	}
	if o.maxDownload, err = parseSize("--max-download-size", c.String("max-download-size")); err != nil {
		return o, err
	}
	s := sandboxOptions{image: c.String("image"), network: runtime.NetworkHost, tmpBytes: 256 << 20}
	s.limits = runtime.Limits{CPUs: defaultCPUs, Pids: defaultPids}
	if s.limits.MemoryBytes, err = parseSize("--memory", c.String("memory")); err != nil {
		return o, err
	}
	if s.pull, err = pullOptions(c); err != nil {
		return o, err
	}
	o.sandbox = s
	return o, nil
}

// fetchWheels runs pip download (wheels only) in a fresh host-network
// sandbox that writes into an inbox, removes the sandbox, then imports
// the inbox through the same validation as pipcache add.
func fetchWheels(ctx context.Context, c *cli.Context, o fetchOptions) ([]*pipcache.Wheel, error) {
	cache, err := openPipcache(c)
	if err != nil {
		return nil, err
	}
	inbox, err := cache.NewInbox(o.maxDownload, sandboxUID, sandboxGID)
	if err != nil {
		return nil, err
	}
	defer inbox.Close()
	o.sandbox.spec = []runtime.SpecOpt{runtime.WithBind(inbox.Dir, fetchMount, false)}
	sb, err := createSandbox(ctx, c, o.sandbox)
	if err != nil {
		return nil, err
	}
	remove := func() error { return removeSandbox(context.WithoutCancel(ctx), c, sb.Name) }
	defer remove() // on failure; a second removal is a no-op
	args := []string{"download", "--only-binary=:all:", "--no-cache-dir", "--progress-bar=off", "--dest", fetchMount}
	if o.indexURL != "" {
		args = append(args, "--index-url", o.indexURL)
	}
	if err := runPip(ctx, sb, snippetLimits(o.sandbox.limits), o.timeout, append(append(args, "--"), o.reqs...)...); err != nil {
		return nil, fmt.Errorf("fetch %s: %w", strings.Join(o.reqs, " "), err)
	}
	// Nothing may write the inbox while it is imported.
	if err := remove(); err != nil {
		return nil, err
	}
	return cache.AddInbox(ctx, inbox)
}
