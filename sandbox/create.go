package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/flock"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Paths inside every sandbox, all under /dev, the sandbox's own tmpfs. The
// image cache makes the mount points in the cached tree when it unpacks it
// (mountPoints): runsc would otherwise make them there, tmpfs or not.
const (
	agentBinary   = "/dev/.flmbox/bin/flmbox-agent"
	agentRunDir   = "/dev/.flmbox/run"
	agentSocket   = agentRunDir + "/agent.sock"
	pipcacheMount = "/dev/.flmbox/wheels"
)

// UID and GID are the user that snippets run as in every sandbox. The
// agent runs as root (of gVisor's user namespace: nothing on the host) with
// agentCapabilities only, so that no snippet can signal, trace or reach it
// (see package snippet's Agent.User).
const UID, GID = 65534, 65534

// agentCapabilities are all the agent needs: to kill snippets, start them as
// UID (setuid, setgid, their rlimits), and empty /tmp of their files.
var agentCapabilities = []string{"CAP_KILL", "CAP_SETUID", "CAP_SETGID", "CAP_SYS_RESOURCE", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}

// runDirOptions bound ROOT/sandboxes/NAME/run, a tmpfs of its own: the agent
// (root) makes its socket there, and it would be on the host's disk
// otherwise. Its mode keeps the snippets' user out: the socket cannot be
// reached from inside but by root.
const runDirOptions = "size=64k,nr_inodes=64,mode=0700"

// agentTimeout bounds the wait for a new sandbox's agent.
const agentTimeout = 10 * time.Second

// preinstallTimeout bounds Spec.Pip's pip install.
const preinstallTimeout = 10 * time.Minute

// Create makes a running sandbox from spec: it prewarms the image (a cached
// one needs no registry), leases it, starts runsc with the agent as the
// first process and waits until the agent answers, then installs spec.Pip.
// On failure nothing is left: no sandbox, no lease, no mount, no runsc
// container; runsc's log of a sandbox it failed to start is kept in
// ROOT/logs/NAME.create.log, which the error names. A sandbox named
// spec.Name that exists already fails with errdefs.ErrAlreadyExists, unless
// it is what a killed Create left (or an ephemeral one whose owner is gone),
// which is removed first. A process without root (and CAP_SYS_ADMIN) is
// refused before anything is made (errdefs.ErrPermissionDenied); a full
// disk is errdefs.ErrResourceExhausted; a ctx that ends is in the error's
// chain (errors.Is(err, context.DeadlineExceeded)).
func (m *Manager) Create(ctx context.Context, spec Spec) (_ *Sandbox, err error) {
	defer func() { err = exhausted(ctx, err) }()
	spec, err = spec.withDefaults(m.root)
	if err != nil {
		return nil, err
	}
	if spec.Name == "" {
		spec.Name = "sb-" + randomHex(6)
	}
	if err := checkPrivileges(fmt.Sprintf("create sandbox %q", spec.Name)); err != nil {
		return nil, err
	}
	agent, err := m.Agent() // before pulling anything
	if err != nil {
		return nil, err
	}
	if err := m.nameFree(ctx, spec.Name); err != nil { // before pulling anything
		return nil, err
	}
	rt, err := m.runtime()
	if err != nil {
		return nil, err
	}
	pull, err := pullOptions(spec)
	if err != nil {
		return nil, err
	}
	img, err := m.store.Prewarm(ctx, spec.Image, pull)
	if err != nil {
		return nil, err
	}
	cfg, err := m.store.Config(img.ManifestDigest)
	if err != nil {
		return nil, err
	}
	sh, err := m.shapeOf(spec, img.ManifestDigest)
	if err != nil {
		return nil, err
	}
	rec := &record.Record{Name: spec.Name, ID: runtime.NewID(), HandOut: randomHex(8), Labels: maps.Clone(spec.Labels), Image: spec.Image, Manifest: img.ManifestDigest,
		Network: string(spec.Network), Platform: spec.Platform, Limits: record.Limits(spec.Limits), State: record.Creating,
		Created: time.Now().UTC(), Shape: sh.key()}
	if spec.Ephemeral {
		if rec.Owner, err = record.Self(); err != nil {
			return nil, fmt.Errorf("create sandbox %q: %w", spec.Name, err)
		}
	}
	lock, err := m.claim(ctx, rec)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	ran := false // runsc ran: its log is kept
	defer func() {
		if err != nil {
			if ran {
				m.keepCreateLog(rec)
			}
			if derr := m.destroy(ctx, rec); derr != nil {
				m.o.warnf("%v", derr)
			}
		}
	}()
	// The record is written: from here on, whatever is left behind by a
	// crash, Reconcile finds and removes.
	if err := m.store.Lease(ctx, img.ManifestDigest, leaseHolder(rec)); err != nil {
		return nil, err
	}
	agentBin, err := m.agentCopy(agent)
	if err != nil {
		return nil, err
	}
	resolverReady := func() error { return nil }
	if spec.Network == NetworkEgress {
		if resolverReady, err = m.makeEgress(ctx, rec, spec.Egress.policy()); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				resolverReady() // before destroy, which stops it
			}
		}()
	}
	opts, err := m.specOpts(spec, rec, img, cfg.Config.Env, agentBin)
	if err != nil {
		return nil, err
	}
	opts = append(opts, runtime.WithCwd(m.workdir(img.Rootfs, cfg.Config.WorkingDir)))
	if err := mountRunDir(rec); err != nil {
		return nil, err
	}
	ospec, err := runtime.GenerateSpec(opts...)
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(consolePath(rec), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	ran = true
	pid, err := rt.Run(ctx, container(rec), rec.Dir, ospec, logf)
	if err != nil {
		return nil, m.runscFailed(ctx, fmt.Sprintf("create sandbox %q: run runsc", rec.Name), consolePath(rec), m.createLog(rec), err)
	}
	rec.Process = sandboxProcess(pid)
	if err := waitForAgent(ctx, rec); err != nil {
		m.o.debugf("%v", err)
		return nil, err
	}
	if err := resolverReady(); err != nil {
		return nil, err
	}
	if err := m.preinstall(ctx, rec, spec.Pip); err != nil {
		return nil, err
	}
	rec.State = record.Running
	if err := record.Write(rec); err != nil {
		return nil, err
	}
	return m.sandbox(rec), nil
}

// specOpts are a new sandbox's spec: the cached rootfs read-only, /tmp, the
// sandbox user, the environment, the agent, the wheel cache, the files of
// /etc, the caller's mounts, the run directory, network and limits.
func (m *Manager) specOpts(spec Spec, rec *record.Record, img *rootfs.Result, imageEnv []string, agent string) ([]runtime.SpecOpt, error) {
	spareLimits, err := json.Marshal(rec.SnippetLimits())
	if err != nil {
		return nil, err
	}
	etc, err := writeEtc(rec, img, spec.Mounts)
	if err != nil {
		return nil, err
	}
	extraEnv := slices.Concat([]string{"HOSTNAME=" + hostname(rec)}, m.wheelsEnv(spec.Network != NetworkNone), spec.Env)
	opts := append(rootOpts(spec, img.Rootfs),
		runtime.WithUser(0, 0),
		runtime.WithCapabilities(agentCapabilities...),
		runtime.WithEnv(Environment(imageEnv, extraEnv)),
		runtime.WithBind(agent, agentBinary, true),
		runtime.WithBind(m.wheels.WheelsDir(), pipcacheMount, true),
		runtime.WithArgs(agentArgs(spec, spareLimits)...))
	opts = append(opts, etc...)
	for _, mt := range spec.Mounts {
		opts = append(opts, runtime.WithBind(mt.Source, mt.Destination, !mt.ReadWrite))
	}
	if spec.fetch != "" {
		opts = append(opts, runtime.WithBind(spec.fetch, fetchMount, false))
	}
	opts = append(opts, withRunDir(rec))
	if spec.Network == NetworkEgress {
		opts = append(opts, runtime.WithNetNS(netnsPath(rec)))
	}
	return append(opts, boundOpts(spec)...), nil
}

// workdir is the working directory of a sandbox's snippets: the image's
// WORKDIR where the snippets' user may enter and list it, as docker's
// container starts there; else /tmp, said under --debug.
func (m *Manager) workdir(tree, imageDir string) string {
	if imageDir == "" {
		return "/tmp"
	}
	if err := rootfs.Enterable(tree, imageDir, UID, GID); err != nil {
		m.o.debugf("the image's WORKDIR %s is not the snippets' working directory, /tmp is: %v", imageDir, err)
		return "/tmp"
	}
	return path.Clean(imageDir)
}

// rootOpts are what every container of spec starts from: the cached rootfs
// read-only, and /tmp.
func rootOpts(spec Spec, rootfsDir string) []runtime.SpecOpt {
	return []runtime.SpecOpt{runtime.WithRootfs(rootfsDir), runtime.WithTmp(spec.TmpBytes)}
}

// boundOpts are what bounds every container of spec: its network and
// limits.
func boundOpts(spec Spec) []runtime.SpecOpt {
	return []runtime.SpecOpt{runtime.WithNetwork(runscNetwork(spec.Network)), runtime.WithLimits(runtimeLimits(spec.Limits))}
}

// bareSpec is Plumbing.BareSpec.
func bareSpec(spec Spec, rootfsDir string, imageEnv []string, argv ...string) (*specs.Spec, error) {
	spec, err := spec.Normalize()
	if err != nil {
		return nil, err
	}
	opts := append(rootOpts(spec, rootfsDir),
		runtime.WithUser(UID, GID),
		runtime.WithEnv(Environment(imageEnv, spec.Env)),
		runtime.WithArgs(argv...))
	return runtime.GenerateSpec(append(opts, boundOpts(spec)...)...)
}

// agentArgs is the agent's command line in a sandbox of spec.
func agentArgs(spec Spec, spareLimits []byte) []string {
	args := []string{agentBinary, "--socket", agentSocket, "--user", fmt.Sprintf("%d:%d", UID, GID), "--limits", string(spareLimits),
		"--memory-budget", strconv.FormatInt(spec.Limits.MemoryBytes, 10),
		"--inode-bytes", strconv.FormatInt(runtime.InodeBytes, 10)}
	if spec.LazySpares {
		args = append(args, "--spares=lazy")
	}
	if n := shownCPUs(spec.Limits); n > 0 {
		args = append(args, "--cpus", strconv.Itoa(n))
	}
	return args
}

// claim makes the sandbox's directory with its record, locked, under its
// name: made under a temporary name and renamed, so that the directory
// never exists without its record and lock. A directory of that name that
// a killed Create or Remove left is removed first.
func (m *Manager) claim(ctx context.Context, rec *record.Record) (*flock.Lock, error) {
	dir, err := record.Dir(m.root, rec.Name)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".new-")
	if err != nil {
		return nil, fmt.Errorf("create sandbox %q: %w", rec.Name, err)
	}
	lock, err := tryLock(tmp) // Reconcile leaves .new-* directories alone for a minute
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("create sandbox %q: %w", rec.Name, err)
	}
	rec.Dir = tmp
	if err := record.Write(rec); err != nil {
		lock.Unlock()
		os.RemoveAll(tmp)
		return nil, err
	}
	for try := 0; ; try++ {
		err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
		if err == nil {
			rec.Dir = dir
			return lock, nil
		}
		if try > 0 || !errors.Is(err, unix.EEXIST) {
			break
		}
		if _, gone, _ := m.reconcileDir(ctx, dir); !gone {
			break
		}
		// A killed flmbox left it: it is gone now.
	}
	lock.Unlock()
	os.RemoveAll(tmp)
	if errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("sandbox %q %w", rec.Name, errdefs.ErrAlreadyExists)
	}
	return nil, fmt.Errorf("create sandbox %q: %w", rec.Name, err)
}

// leaseHolder is the holder of the sandbox's image lease: its name and its
// runsc container's ID when it was made (a pooled sandbox keeps it under its
// later names: Record.Lease), so that a lease of a removed sandbox is never
// taken for one of a new sandbox of the same name.
func leaseHolder(rec *record.Record) string {
	if rec.Lease != "" {
		return rec.Lease
	}
	return rec.Name + "." + rec.ID
}

// parseHolder returns the sandbox name and container ID of a lease holder,
// false if holder is not one.
func parseHolder(holder string) (name, id string, ok bool) {
	i := strings.LastIndexByte(holder, '.')
	if i < 0 || !strings.HasPrefix(holder[i+1:], "flmbox-") {
		return "", "", false
	}
	return holder[:i], holder[i+1:], true
}

// container is what runsc knows of the sandbox.
func container(rec *record.Record) runtime.Container {
	return runtime.Container{ID: rec.ID, Network: runscNetwork(Network(rec.Network)), Platform: rec.Platform}
}

func runtimeLimits(l Limits) runtime.Limits {
	return runtime.Limits{MemoryBytes: l.MemoryBytes, CPUs: l.CPUs, Pids: l.Pids}
}

func consolePath(rec *record.Record) string { return filepath.Join(rec.Dir, "console.log") }

// mountRunDir makes the sandbox's run directory, a small tmpfs of its own.
func mountRunDir(rec *record.Record) error {
	if err := os.Mkdir(rec.RunDir(), 0o700); err != nil {
		return fmt.Errorf("create sandbox %q's run directory: %w", rec.Name, err)
	}
	if err := unix.Mount("tmpfs", rec.RunDir(), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, runDirOptions); err != nil {
		return fmt.Errorf("mount sandbox %q's run directory: %w", rec.Name, err)
	}
	return nil
}

// withRunDir mounts the run directory (root's, mode 0700) at agentRunDir.
func withRunDir(rec *record.Record) runtime.SpecOpt {
	return runtime.WithBind(rec.RunDir(), agentRunDir, false)
}

// waitForAgent waits until the agent accepts connections (agentTimeout at
// most). It tries every millisecond: a try that fails costs microseconds,
// and the agent is up within milliseconds of runsc run's return.
func waitForAgent(ctx context.Context, rec *record.Record) error {
	deadline := time.Now().Add(agentTimeout)
	for {
		conn, err := wire.Dial(ctx, rec.SocketPath())
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(consolePath(rec))
			return fmt.Errorf("start sandbox %q: its agent did not answer within %s: %w; its output: %q: %w",
				rec.Name, agentTimeout, err, lastLines(string(log), 5), errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("start sandbox %q: wait for its agent: %w", rec.Name, context.Cause(ctx))
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
