package app

import (
	"fmt"
	"strings"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
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
	n, err := parseSize("--max-unpacked-size", c.String("max-unpacked-size"))
	if err != nil {
		return nil, err
	}
	o.Unpack.MaxBytes = n
	return o, nil
}

// jsonFlag makes a command print JSON.
var jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON"}

// Sandbox defaults (issue 3): the whole sandbox's cgroup backstop.
const (
	defaultMemory  = "512MiB"
	defaultCPUs    = 1.0
	defaultPids    = 256
	defaultTmpSize = "256MiB"
)

// sandboxFlags configure a new sandbox.
func sandboxFlags() []cli.Flag {
	return append(pullFlags(),
		&cli.StringFlag{Name: "network", Value: "none", Usage: "network: none or host"},
		&cli.StringFlag{Name: "memory", Value: defaultMemory, Usage: "memory of the sandbox's processes and /tmp together; a snippet that would exceed it is killed (its cgroup allows a quarter more, for gVisor)"},
		&cli.Float64Flag{Name: "cpus", Value: defaultCPUs, Usage: "CPU limit of the sandbox"},
		&cli.Int64Flag{Name: "pids", Value: defaultPids, Usage: "process limit of the sandbox"},
		&cli.StringFlag{Name: "tmp-size", Value: defaultTmpSize, Usage: "size of the sandbox's writable /tmp"},
		&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "set `K=V` in the sandbox's environment"},
		&cli.StringFlag{Name: "gvisor-platform", Usage: "gVisor platform: systrap, ptrace or kvm (default: runsc's)"},
		&cli.GenericFlag{Name: "pip", Value: &stringList{}, Usage: "preinstall `REQUIREMENT` from the wheel cache when the sandbox is created (repeatable)"},
	)
}

// stringList is a repeatable flag whose values are kept whole: a
// StringSliceFlag would split "pkg>=1,<2" at its comma.
type stringList []string

func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
func (l *stringList) String() string     { return strings.Join(*l, " ") }

// sandboxOptionsFrom reads sandboxFlags.
func sandboxOptionsFrom(c *cli.Context) (sandboxOptions, error) {
	o := sandboxOptions{image: c.String("image"), platform: c.String("gvisor-platform"), env: c.StringSlice("env")}
	var err error
	if o.pull, err = pullOptions(c); err != nil {
		return o, err
	}
	if o.network, err = runtime.ParseNetwork(c.String("network")); err != nil {
		return o, err
	}
	if o.limits.MemoryBytes, err = parseSize("--memory", c.String("memory")); err != nil {
		return o, err
	}
	if o.tmpBytes, err = parseSize("--tmp-size", c.String("tmp-size")); err != nil {
		return o, err
	}
	o.limits.CPUs, o.limits.Pids = c.Float64("cpus"), c.Int64("pids")
	if o.limits.CPUs <= 0 || o.limits.Pids <= 0 {
		return o, fmt.Errorf("--cpus and --pids must be positive")
	}
	if l, ok := c.Generic("pip").(*stringList); ok {
		o.pip = *l
	}
	if err := checkRequirements(o.pip); err != nil {
		return o, err
	}
	if len(o.pip) > 0 && c.IsSet("batch") {
		// A batch resets its sandboxes between snippets, emptying /tmp.
		return o, fmt.Errorf("--pip does not apply to --batch, whose snippets each start with an empty /tmp: install in the snippets (pip install NAME installs from the wheel cache)")
	}
	for _, kv := range o.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return o, fmt.Errorf("--env %q: want K=V", kv)
		}
	}
	return o, nil
}

func parseSize(flag, s string) (int64, error) {
	n, err := units.RAMInBytes(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s %q: want a size such as 512MiB or 1g", flag, s)
	}
	return n, nil
}
