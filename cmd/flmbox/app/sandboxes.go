package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/internal/warmcall"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Paths inside every sandbox.
const (
	agentBinary = "/dev/.flmbox/bin/flmbox-agent"
	agentRunDir = "/dev/.flmbox/run"
	agentSocket = agentRunDir + "/agent.sock"
)

// sandboxUser is the user snippets run as.
const sandboxUID, sandboxGID = 65534, 65534

// flmboxEnv is what flmbox adds to the image's environment.
var flmboxEnv = []string{
	"PIP_TARGET=/tmp/site-packages", // not a system install: PEP 668 does not apply
	"PIP_CACHE_DIR=/tmp/.cache/pip",
	"HOME=/tmp",
	"PYTHONUNBUFFERED=1",
	"LANG=C.UTF-8",
}

// sandboxOptions is what a new sandbox is made of.
type sandboxOptions struct {
	name, image string
	network     runtime.Network
	platform    string // gVisor's
	limits      runtime.Limits
	tmpBytes    int64
	env         []string // --env K=V
	pull        *rootfs.PullOptions
	pip         []string          // --pip: requirements preinstalled from the wheel cache
	spec        []runtime.SpecOpt // more mounts (pipcache fetch's inbox)
}

// openRuntime returns the sandboxes' runtime under the state root.
func openRuntime(c *cli.Context) (*runtime.Runtime, error) {
	runsc, err := runtime.FindRunsc(c.String("runsc"))
	if err != nil {
		return nil, err
	}
	return runtime.NewRuntime(runsc, c.String("root"))
}

// createSandbox makes a running sandbox from a cached (or now prewarmed)
// image, with flmbox's agent as its first process, and waits until the agent
// answers. On failure nothing is left: no sandbox, no lease.
func createSandbox(ctx context.Context, c *cli.Context, o sandboxOptions) (_ *runtime.Sandbox, err error) {
	agent, err := agentPath()
	if err != nil {
		return nil, err
	}
	store, err := openStore(c)
	if err != nil {
		return nil, err
	}
	rt, err := openRuntime(c)
	if err != nil {
		return nil, err
	}
	img, err := store.Prewarm(ctx, o.image, o.pull)
	if err != nil {
		return nil, err
	}
	cfg, err := store.Config(img.ManifestDigest)
	if err != nil {
		return nil, err
	}
	if o.name == "" {
		o.name = "sb-" + randomHex(6)
	}
	if err := runtime.ValidateName(o.name); err != nil {
		return nil, err
	}
	if _, err := rt.Get(o.name); err == nil {
		return nil, fmt.Errorf("sandbox %q already exists; choose another name or remove it (flmbox sandbox rm %s): %w", o.name, o.name, errdefs.ErrAlreadyExists)
	}
	// The lease is this call's only if Lease succeeds (a concurrent create of
	// the same name fails here), so only then is it released on failure.
	if err := store.Lease(ctx, img.ManifestDigest, o.name); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			store.Release(context.WithoutCancel(ctx), img.ManifestDigest, o.name)
		}
	}()
	limits := snippetLimits(o.limits)
	spareLimits, err := json.Marshal(limits)
	if err != nil {
		return nil, err
	}
	wheels, pipEnv, err := withPipcache(c, o.network)
	if err != nil {
		return nil, err
	}
	sb, err := rt.Create(ctx, runtime.Config{
		Name: o.name, Image: o.image, Network: o.network, Platform: o.platform, RunDir: agentRunDir, Limits: o.limits,
		Spec: append([]runtime.SpecOpt{
			runtime.WithRootfs(img.Rootfs),
			runtime.WithTmp(o.tmpBytes),
			runtime.WithUser(sandboxUID, sandboxGID),
			runtime.WithEnv(sandboxEnv(cfg.Config.Env, append(pipEnv, o.env...))),
			runtime.WithBind(agent, agentBinary, true),
			wheels,
			runtime.WithArgs(agentBinary, "--socket", agentSocket, "--limits", string(spareLimits),
				"--memory-budget", strconv.FormatInt(o.limits.MemoryBytes, 10)),
		}, o.spec...),
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			rt.Remove(context.WithoutCancel(ctx), sb.Name)
		}
	}()
	if err = recordManifest(sb, img.ManifestDigest); err != nil {
		return nil, err
	}
	if err = waitForAgent(ctx, sb); err != nil {
		return nil, err
	}
	if err = sb.SealRunDir(); err != nil {
		return nil, err
	}
	if err = preinstall(ctx, sb, o.pip, limits); err != nil {
		return nil, err
	}
	return sb, nil
}

// agentName is the sandboxes' agent (cmd/flmbox-agent), installed next to
// flmbox-core.
const agentName = "flmbox-agent"

// agentPath returns the agent binary next to this one, which every sandbox
// mounts and runs as its first process.
func agentPath() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find %s, the sandboxes' agent: %w", agentName, err)
	}
	p := filepath.Join(filepath.Dir(self), agentName)
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		if err == nil {
			err = errors.New("not an executable file")
		}
		return "", fmt.Errorf("find %s, the sandboxes' agent, next to %s: %w; install flmbox, flmbox-core and flmbox-agent in one directory (make build puts them in bin/)", agentName, self, err)
	}
	return p, nil
}

// sandboxEnv is the image's environment, then flmbox's, then the caller's;
// later entries win. /tmp/site-packages is prepended to PYTHONPATH.
func sandboxEnv(image, user []string) []string {
	env := append([]string{}, image...)
	env = append(env, flmboxEnv...)
	pythonpath := "/tmp/site-packages"
	for _, kv := range append(append([]string{}, image...), user...) {
		if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok && v != "" {
			pythonpath = "/tmp/site-packages:" + v
		}
	}
	env = append(env, "PYTHONPATH="+pythonpath)
	return append(env, user...)
}

// recordManifest notes which cached image the sandbox leases, so that
// removing the sandbox releases it.
func recordManifest(sb *runtime.Sandbox, manifest string) error {
	return os.WriteFile(filepath.Join(sb.Dir, "manifest"), []byte(manifest), 0o600)
}

// removeSandbox removes a sandbox and releases its image. Removing a
// sandbox that does not exist is not an error.
func removeSandbox(ctx context.Context, c *cli.Context, name string) error {
	rt, err := openRuntime(c)
	if err != nil {
		return err
	}
	sb, err := rt.Get(name)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	}
	manifest, _ := os.ReadFile(filepath.Join(sb.Dir, "manifest"))
	if err := rt.Remove(ctx, name); err != nil {
		return err
	}
	if len(manifest) > 0 {
		store, err := openStore(c)
		if err != nil {
			return err
		}
		return store.Release(ctx, string(manifest), name)
	}
	return nil
}

// agentSocketPath is where the host reaches a sandbox's agent.
func agentSocketPath(sb *runtime.Sandbox) string { return warmcall.SocketPath(sb.Dir) }

// waitForAgent waits until the agent accepts connections (10 s at most).
// It tries every millisecond: a try that fails costs microseconds, and the
// agent is up some 15 ms after runsc start.
func waitForAgent(ctx context.Context, sb *runtime.Sandbox) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := wire.Dial(ctx, agentSocketPath(sb))
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(sb.Dir, "console.log"))
			return fmt.Errorf("the agent of sandbox %q did not start: %w; its output: %q", sb.Name, err, lastLines(string(log), 5))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// sandboxState is running only if runsc says so and the agent answers.
func sandboxState(ctx context.Context, rt *runtime.Runtime, sb *runtime.Sandbox) runtime.State {
	if rt.State(ctx, sb) != runtime.StateRunning {
		return runtime.StateDead
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := wire.Dial(dctx, agentSocketPath(sb))
	if err != nil {
		return runtime.StateDead
	}
	conn.Close()
	return runtime.StateRunning
}
