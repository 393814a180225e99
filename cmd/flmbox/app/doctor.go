package app

import (
	"encoding/json"
	"fmt"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/sandbox"
)

// check is one line of doctor's report: sandbox's finding, and what to do
// about it.
type check struct {
	sandbox.Check
	Fix string `json:"fix,omitempty"`
	// Limits are the check's, each with what to set when it is low.
	Limits []limit `json:"limits,omitempty"`
}

// limit is a host limit on the count of sandboxes, and what to set.
type limit struct {
	sandbox.HostLimit
	Fix string `json:"fix,omitempty"`
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check that this worker can run flmbox, and say how to fix what is missing",
		Flags: []cli.Flag{jsonFlag},
		Action: func(c *cli.Context) error {
			// Not openManager: doctor creates nothing, not even the root.
			m, err := sandbox.Open(c.String("root"), sandbox.WithRunsc(c.String("runsc")))
			if err != nil {
				return err
			}
			var checks []check
			failed := 0
			for _, ch := range m.Doctor(c.Context) {
				out := check{Check: ch}
				if !ch.OK {
					failed++
					out.Fix = fix(ch)
				}
				for _, l := range ch.Limits {
					out.Limits = append(out.Limits, limit{l, limitFix(l)})
				}
				checks = append(checks, out)
			}
			if c.Bool("json") {
				if err := json.NewEncoder(c.App.Writer).Encode(checks); err != nil {
					return err
				}
			} else {
				for _, ch := range checks {
					status := "ok"
					switch {
					case !ch.OK:
						status = "FAIL"
					case ch.Warn:
						status = "warn"
					}
					fmt.Fprintf(c.App.Writer, "%-4s  %-9s %s\n", status, ch.Name, ch.Detail)
					if ch.Fix != "" {
						fmt.Fprintf(c.App.Writer, "      %-9s fix: %s\n", "", ch.Fix)
					}
					for _, l := range ch.Limits {
						if l.Low {
							fmt.Fprintf(c.App.Writer, "      %-9s %s\n", "", limitText(l.HostLimit))
							fmt.Fprintf(c.App.Writer, "      %-9s fix: %s\n", "", l.Fix)
						}
					}
				}
			}
			if failed > 0 {
				return cli.Exit(fmt.Sprintf("doctor found %d problem(s)", failed), 1)
			}
			return nil
		},
	}
}

// fix says what to do about a failed check.
func fix(ch sandbox.Check) string {
	switch ch.Name {
	case sandbox.CheckRunsc:
		return "run `make runsc` (builds gVisor's runsc with CGO_ENABLED=0 into /usr/local/bin), or name a runsc binary with --runsc or FLMBOX_RUNSC"
	case sandbox.CheckPlatforms:
		for _, p := range ch.Platforms {
			if p.Supported {
				return fmt.Sprintf("runsc's default platform %s cannot run here: pass --gvisor-platform %s", ch.DefaultPlatform, p.Name)
			}
		}
	case sandbox.CheckAgent:
		return "run `make build`, and install bin/flmbox, bin/flmbox-core, bin/flmbox-agent and bin/flmbox-resolver in one directory"
	case sandbox.CheckRoot:
		return "run flmbox as root: runsc needs it to create sandboxes and the cache keeps images' file owners"
	case sandbox.CheckKernel:
		return "use Linux 5.6 or newer; flmbox needs openat2 to unpack images safely"
	case sandbox.CheckCgroups:
		return "mount the cgroup controllers memory, pids and cpu (cgroup v2 at /sys/fs/cgroup, or v1 hierarchies); sandboxes' limits need them"
	case sandbox.CheckSpace:
		return "free space there, remove images (flmbox images gc), or choose another state root with --root"
	case sandbox.CheckEgress:
		return "only --network egress needs this: install bin/flmbox-resolver beside bin/flmbox-core, and see what the check names (docs/USAGE.md, \"Egress\")"
	}
	return ""
}

// limitText says what a host limit is and how many idle sandboxes it
// allows.
func limitText(l sandbox.HostLimit) string {
	switch l.Name {
	case sandbox.LimitNofile:
		return fmt.Sprintf("%s (hard) is %d: runsc's processes inherit it, and an idle sandbox's sentry holds %d descriptors, one more for each file its sandbox opens",
			l.Name, l.Value, l.PerSandbox)
	case sandbox.LimitMemory:
		return fmt.Sprintf("%s is %s: room for about %d more idle sandboxes (%s each)", l.Name, units.BytesSize(float64(l.Value-l.Used)), l.Sandboxes,
			units.BytesSize(float64(l.PerSandbox)))
	case sandbox.LimitMemcgs:
		return fmt.Sprintf("%s: %d of the kernel's %d in use (a removed sandbox's lingers while page cache it charged stays): room for about %d more sandboxes",
			l.Name, l.Used, l.Value, l.Sandboxes)
	}
	unit := "tasks"
	if l.Name == sandbox.LimitFileMax {
		unit = "open files"
	}
	return fmt.Sprintf("%s is %d: room for about %d more idle sandboxes (%d %s each; %d in use), %d in all", l.Name, l.Value, l.Sandboxes,
		l.PerSandbox, unit, l.Used, l.Value/l.PerSandbox)
}

// limitFix says what to do about a low host limit, "" if it is not low.
func limitFix(l sandbox.HostLimit) string {
	if !l.Low {
		return ""
	}
	switch l.Name {
	case sandbox.LimitNofile:
		return fmt.Sprintf("raise the hard limit of flmbox's processes: ulimit -Hn %d in its shell, or LimitNOFILE=%d in its systemd unit", l.Want, l.Want)
	case sandbox.LimitMemory:
		return "suspend idle sandboxes (flmbox sandbox gc --max-memory SIZE, or --suspend-idle DURATION), or make them with --lazy-spares"
	case sandbox.LimitMemcgs:
		return "the kernel's limit cannot be raised: dropping the page cache frees removed sandboxes' memory cgroups (sync; echo 1 > /proc/sys/vm/drop_caches)"
	}
	return fmt.Sprintf("sysctl -w %s=%d (and put it in /etc/sysctl.d/ to keep it)", l.Name, l.Want)
}
