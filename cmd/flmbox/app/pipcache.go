package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/snippet/wire"
)

// pipcacheMount is where every sandbox sees the wheel cache, read-only.
// It is under /dev, the sandbox's own tmpfs, so that runsc creates the
// mount point there and not in the shared cached rootfs.
const pipcacheMount = "/dev/.flmbox/wheels"

// preinstallTimeout bounds `--pip`'s pip install.
const preinstallTimeout = 10 * time.Minute

func pipcacheCommand() *cli.Command {
	return &cli.Command{
		Name:  "pipcache",
		Usage: "manage the wheel cache that sandboxes install Python packages from",
		Subcommands: []*cli.Command{pipcacheAddCommand(), pipcacheFetchCommand(), pipcacheLsCommand(),
			pipcacheRmCommand()},
	}
}

// openPipcache opens the wheel cache under the state root.
func openPipcache(c *cli.Context) (*pipcache.Cache, error) {
	root := c.String("root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create state root %s: %w; choose another with --root or FLMBOX_ROOT", root, err)
	}
	return pipcache.Open(filepath.Join(root, "pipcache"), nil)
}

// withPipcache returns what gives a new sandbox the wheel cache: a
// read-only bind mount and pip's environment.
func withPipcache(c *cli.Context, network runtime.Network) (runtime.SpecOpt, []string, error) {
	cache, err := openPipcache(c)
	if err != nil {
		return nil, nil, err
	}
	return runtime.WithBind(cache.WheelsDir(), pipcacheMount, true),
		pipcache.SandboxEnv(pipcacheMount, network == runtime.NetworkHost), nil
}

// preinstall installs reqs in a new sandbox from the wheel cache alone
// (--no-index, whatever the sandbox's network), for --pip.
func preinstall(ctx context.Context, sb *runtime.Sandbox, reqs []string, limits wire.Limits) error {
	if len(reqs) == 0 {
		return nil
	}
	args := append([]string{"install", "--no-index", "--quiet", "--"}, reqs...)
	if err := runPip(ctx, sb, limits, preinstallTimeout, args...); err != nil {
		return fmt.Errorf("preinstall %s from the wheel cache: %w; add the wheels first (flmbox pipcache add or flmbox pipcache fetch)",
			strings.Join(reqs, " "), err)
	}
	return nil
}

// runPip runs python3 -m pip with args in sb, through its agent, and fails
// with the end of pip's output if pip fails. It is a Python snippet, not a
// shell one: it takes the Python spare that the agent started before pip
// created /tmp/site-packages, so that the next Python call, in a process
// started after pip, imports what pip installed.
func runPip(ctx context.Context, sb *runtime.Sandbox, limits wire.Limits, timeout time.Duration, args ...string) error {
	list, err := json.Marshal(args) // a JSON array of strings is a Python list literal
	if err != nil {
		return err
	}
	code := "import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '-m', 'pip'] + " + string(list) + "))\n"
	req := &wire.Request{Version: wire.ProtocolVersion, Language: wire.LanguagePython, Code: code,
		TimeoutMS: timeout.Milliseconds(), MaxOutput: 256 << 10, Limits: limits}
	res, err := wire.Call(ctx, agentSocketPath(sb), req)
	switch {
	case err != nil:
		return fmt.Errorf("run pip %s: %w", args[0], err)
	case res.Error != "":
		return fmt.Errorf("run pip %s: %s", args[0], res.Error)
	case res.TimedOut:
		return fmt.Errorf("pip %s timed out after %s", args[0], timeout)
	case res.ExitCode != 0:
		out := strings.TrimSpace(string(res.Stderr.Data))
		if out == "" {
			out = strings.TrimSpace(string(res.Stdout.Data))
		}
		return fmt.Errorf("pip %s failed with exit status %d: %s", args[0], res.ExitCode, lastLines(out, 20))
	}
	return nil
}

// checkRequirements refuses what pip would not read as a requirement:
// options (a leading '-'), control characters, absurd lengths.
func checkRequirements(reqs []string) error {
	for _, r := range reqs {
		if r == "" || len(r) > 1000 || strings.HasPrefix(r, "-") || strings.ContainsFunc(r, func(c rune) bool { return c < ' ' || c == 0x7f }) {
			return fmt.Errorf("requirement %q: want a pip requirement such as NAME, NAME==VERSION or 'NAME>=1,<2': %w", r, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// printAdded prints the wheels an import brought, one per line.
func printAdded(c *cli.Context, wheels []*pipcache.Wheel) {
	for _, w := range wheels {
		state := "added"
		if w.AlreadyCached {
			state = "already cached"
		}
		fmt.Fprintf(c.App.Writer, "%s\t%s\t%s\n", w.Filename, w.Digest, state)
	}
}
