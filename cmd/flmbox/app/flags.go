package app

import (
	"fmt" // package runtime is flmbox's runsc driver
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/sandbox"
)

// tableFlags are urfave/cli's flags for a table of runcmd's.
func tableFlags(table []runcmd.Flag) []cli.Flag {
	var out []cli.Flag
	for _, f := range table {
		switch f.Kind {
		case runcmd.String, runcmd.Size:
			out = append(out, &cli.StringFlag{Name: f.Name, Aliases: f.Aliases, Value: f.Default, DefaultText: f.DefaultText, EnvVars: f.EnvVars, Usage: f.Usage})
		case runcmd.Bool:
			out = append(out, &cli.BoolFlag{Name: f.Name, Aliases: f.Aliases, DefaultText: f.DefaultText, EnvVars: f.EnvVars, Usage: f.Usage})
		case runcmd.Duration:
			var d time.Duration
			var err error
			if f.Default != "" { // none: zero
				d, err = time.ParseDuration(f.Default)
			}
			if err != nil {
				panic(fmt.Sprintf("flag --%s: default %q is not a duration", f.Name, f.Default))
			}
			// run's durations (--timeout, --callback-idle) are all positive.
			out = append(out, &cli.GenericFlag{Name: f.Name, Aliases: f.Aliases, Value: &durationValue{d: d}, DefaultText: f.DefaultText, EnvVars: f.EnvVars, Usage: f.Usage})
		case runcmd.Int:
			n := 0
			if f.Default != "" {
				var err error
				if n, err = strconv.Atoi(f.Default); err != nil {
					panic(fmt.Sprintf("flag --%s: default %q is not an integer", f.Name, f.Default))
				}
			}
			out = append(out, &cli.IntFlag{Name: f.Name, Aliases: f.Aliases, Value: n, DefaultText: f.DefaultText, EnvVars: f.EnvVars, Usage: f.Usage})
		case runcmd.List:
			out = append(out, &cli.GenericFlag{Name: f.Name, Aliases: f.Aliases, Value: &stringList{}, DefaultText: f.DefaultText, EnvVars: f.EnvVars, Usage: f.Usage})
		default:
			panic(fmt.Sprintf("flag --%s: unknown kind %d", f.Name, f.Kind))
		}
	}
	return out
}

// pullFlags select and bound what an image pull fetches.
func pullFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "platform", Usage: "platform to pull, os/arch[/variant] (default: this worker's)"},
		&cli.StringFlag{Name: "pull", Value: "missing", Usage: "when a tag asks its registry: `missing` (only when the image of its last resolution here is not cached), always, never"},
		&cli.BoolFlag{Name: "offline", Usage: "never contact a registry: resolve tags from their last resolution (--pull never)"},
		&cli.StringSliceFlag{Name: "insecure-registry", Usage: "registry `HOST[:PORT]` that may be reached over plain HTTP (loopback always may)"},
		&cli.StringFlag{Name: "max-unpacked-size", Value: "16GiB", Usage: "refuse images whose layers unpack to more than this"},
	}
}

// pullOptions reads pullFlags.
func pullOptions(c *cli.Context) (*rootfs.PullOptions, error) {
	policy, err := rootfs.ParsePullPolicy(c.String("pull"))
	if err != nil {
		return nil, fmt.Errorf("--pull: %w", err)
	}
	if c.Bool("offline") {
		if c.IsSet("pull") && policy != rootfs.PullNever {
			return nil, fmt.Errorf("--offline is --pull never, not --pull %s: %w", policy, errdefs.ErrInvalidArgument)
		}
		policy = rootfs.PullNever
	}
	o := &rootfs.PullOptions{
		Policy:             policy,
		InsecureRegistries: c.StringSlice("insecure-registry"),
		Unpack:             rootfs.UnpackOptions{Warnf: func(f string, a ...any) { warnf(c, f, a...) }},
		Warnf:              func(f string, a ...any) { warnf(c, f, a...) },
	}
	if c.Bool("debug") {
		o.Debugf = func(f string, a ...any) { fmt.Fprintf(c.App.ErrWriter, "flmbox: debug: "+f+"\n", a...) }
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

// sandboxFlags configure a new sandbox. run takes them with --image; its
// --env is its call's (runcmd.RunFlags), not the sandbox's: see
// sandboxEnvFlag.
func sandboxFlags() []cli.Flag {
	return append(pullFlags(),
		&cli.StringFlag{Name: "network", Value: "none", Usage: "network: none; egress (only what --allow names, through a policy on the host); host (everything the host reaches: trusts the code)"},
		&cli.GenericFlag{Name: "allow", Value: &stringList{}, Usage: "with --network egress, let the sandbox reach `HOST|*.DOMAIN|IP|CIDR[:PORT]` (repeatable); private, link-local and the host's addresses only by range"},
		&cli.GenericFlag{Name: "deny", Value: &stringList{}, Usage: "with --network egress, refuse `HOST|*.DOMAIN|IP|CIDR[:PORT]` even if allowed (repeatable)"},
		&cli.GenericFlag{Name: "dns", Value: &stringList{}, Usage: "with --network egress, the DNS server `IP` the sandbox's resolver asks (repeatable; default: the host's)"},
		&cli.StringFlag{Name: "memory", Value: units.BytesSize(float64(sandbox.DefaultLimits.MemoryBytes)), Usage: "memory of the sandbox's processes and /tmp together; a snippet that would exceed it is killed (its cgroup allows a quarter more, for gVisor)"},
		&cli.Float64Flag{Name: "cpus", Value: sandbox.DefaultLimits.CPUs, Usage: "CPU limit of the sandbox"},
		&cli.Int64Flag{Name: "pids", Value: sandbox.DefaultLimits.Pids, Usage: "process limit of the sandbox"},
		&cli.StringFlag{Name: "tmp-size", Value: units.BytesSize(sandbox.DefaultTmpBytes), Usage: "size of the sandbox's writable /tmp"},
		&cli.StringFlag{Name: "gvisor-platform", Usage: "gVisor platform: systrap, ptrace or kvm (default: runsc's)"},
		&cli.GenericFlag{Name: "pip", Value: &stringList{}, Usage: "preinstall `REQUIREMENT` from the wheel cache when the sandbox is created (repeatable)"},
		&cli.BoolFlag{Name: "lazy-spares", Usage: "start no interpreter ahead of each language's first call, nor keep one past 30s without calls: an idle sandbox costs less memory, that first call more time"},
	)
}

// sandboxEnvFlag sets a new sandbox's environment (Spec.Env), for the
// commands that make sandboxes to keep: sandbox create, pool fill,
// instance. run's --env is its call's (sandbox.Request.Env), so that a
// pooled sandbox of its image's shape still serves it.
func sandboxEnvFlag() cli.Flag {
	return &cli.GenericFlag{Name: "env", Aliases: []string{"e"}, Value: &stringList{}, Usage: "set `K=V` in the sandbox's environment (repeatable)"}
}

// stringList is a repeatable flag whose values are kept whole: a
// StringSliceFlag would split "pkg>=1,<2" at its comma.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, " ") }

func (l *stringList) Set(v string) error {
	if v != aliasCopy {
		*l = append(*l, v)
	}
	return nil
}

// Serialize is what urfave/cli sets a flag's other names to once one was
// given (cli.Serializer): -e K=V is copied to --env as Set(Serialize()).
// The names share one list, so there is nothing to copy: Set ignores it.
// (Without it, String() would be appended again.)
func (l *stringList) Serialize() string { return aliasCopy }

// aliasCopy is stringList's Serialize, a value no argument can be (a NUL).
const aliasCopy = "\x00flmbox: copied to an alias"

// listFlag returns the values of a repeatable flag made by tableFlags or
// sandboxFlags (a stringList).
func listFlag(c *cli.Context, name string) []string {
	if l, ok := c.Generic(name).(*stringList); ok {
		return *l
	}
	return nil
}

// labelsFlag reads --label K=V values (K alone: an empty value).
func labelsFlag(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--label %s: given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// sandboxSpec reads sandboxFlags, sandboxEnvFlag and --image into a
// sandbox spec.
func sandboxSpec(c *cli.Context) (sandbox.Spec, error) {
	s, err := specFrom(c)
	s.Env = listFlag(c, "env")
	return s, err
}

// specFrom reads sandboxFlags and --image into a sandbox spec.
func specFrom(c *cli.Context) (sandbox.Spec, error) {
	s := sandbox.Spec{Image: c.String("image"), Platform: c.String("gvisor-platform")}
	var err error
	if s.Pull, err = pullOptions(c); err != nil {
		return s, err
	}
	if s.Network, err = sandbox.ParseNetwork(c.String("network")); err != nil {
		return s, err
	}
	if s.Egress, err = egressFrom(c); err != nil {
		return s, err
	}
	if s.Limits.MemoryBytes, err = parseSize("--memory", c.String("memory")); err != nil {
		return s, err
	}
	if s.TmpBytes, err = parseSize("--tmp-size", c.String("tmp-size")); err != nil {
		return s, err
	}
	s.Limits.CPUs, s.Limits.Pids = c.Float64("cpus"), c.Int64("pids")
	// A zero limit is the default's to a Spec; given as a flag, it is a
	// mistake.
	if !(s.Limits.CPUs > 0) { // NaN too
		return s, fmt.Errorf("--cpus %g: want more than 0", s.Limits.CPUs)
	}
	if s.Limits.Pids <= 0 {
		return s, fmt.Errorf("--pids %d: want more than 0", s.Limits.Pids)
	}
	s.Pip = listFlag(c, "pip")
	s.LazySpares = c.Bool("lazy-spares")
	if _, err := s.Normalize(); err != nil {
		return s, err
	}
	if len(s.Pip) > 0 && c.IsSet("batch") {
		return s, advise(fmt.Errorf("--pip does not apply to --batch, whose snippets each start with an empty /tmp"),
			"install in the snippets: pip install NAME installs from the wheel cache")
	}
	return s, nil // the rest (--env's K=V, ...) is checked by package sandbox before anything runs
}

// egressFrom reads --allow, --deny and --dns.
func egressFrom(c *cli.Context) (sandbox.Egress, error) {
	var e sandbox.Egress
	for _, f := range []struct {
		name  string
		rules *[]sandbox.EgressRule
	}{{"allow", &e.Allow}, {"deny", &e.Deny}} {
		for _, v := range listFlag(c, f.name) {
			r, err := sandbox.ParseEgressRule(v)
			if err != nil {
				return e, fmt.Errorf("--%s: %w", f.name, err)
			}
			*f.rules = append(*f.rules, r)
		}
	}
	for _, v := range listFlag(c, "dns") {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return e, fmt.Errorf("--dns %q: want an IPv4 address", v)
		}
		e.DNS = append(e.DNS, a)
	}
	return e, nil
}

func parseSize(flag, s string) (int64, error) {
	n, err := units.RAMInBytes(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s %q: want a size such as 512MiB or 1g", flag, s)
	}
	return n, nil
}
