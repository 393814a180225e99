package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/names"
)

// State is a sandbox's state as flmbox sees it.
//
// A sandbox is created and started (runsc run --detach) in one step by Runtime.Create
// and is then Running until its gVisor processes die (Dead) or it is removed
// by Runtime.Remove, which works from either state. There are no other
// transitions: a Dead sandbox is never restarted, only removed.
type State string

// Sandbox states.
const (
	StateRunning State = "running"
	StateDead    State = "dead"
)

// Config describes a new sandbox.
type Config struct {
	// Name is the sandbox's name: 1 to 64 of [A-Za-z0-9_.-], starting with a
	// letter or digit. Empty: a generated name.
	Name string
	// Image is the image the sandbox was made from, for listings.
	Image string
	// Spec options: the rootfs, mounts, environment, limits and the first
	// process. WithNetwork is added from Network.
	Spec []SpecOpt
	// Network is the network mode (default none).
	Network Network
	// Limits are the sandbox's cgroup limits (added to Spec with WithLimits
	// and recorded with the sandbox).
	Limits Limits
	// Platform is gVisor's platform (systrap, ptrace, kvm); empty: runsc's
	// default.
	Platform string
	// RunDir, if set, is a path inside the sandbox where the host directory
	// DIR/run is mounted read-write, owned by the sandbox's user: processes
	// inside can create Unix sockets there that the host connects to
	// (runsc --host-uds=create).
	RunDir string
}

// Runtime creates and finds sandboxes whose state lives under one
// directory, so that they outlive the process that created them.
type Runtime struct {
	runsc string
	dir   string // state directory: DIR/sandboxes/NAME, DIR/runsc (runsc's --root)
}

// NewRuntime returns a Runtime using the runsc binary at runsc and keeping
// its state under dir.
func NewRuntime(runsc, dir string) (*Runtime, error) {
	for _, d := range []string{filepath.Join(dir, "sandboxes"), filepath.Join(dir, "runsc")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create sandbox state directory: %w", err)
		}
	}
	return &Runtime{runsc: runsc, dir: dir}, nil
}

// Sandbox is a sandbox's record, as stored in DIR/sandboxes/NAME/sandbox.json.
type Sandbox struct {
	Name     string    `json:"name"`
	ID       string    `json:"id"` // runsc's container ID
	Image    string    `json:"image"`
	Network  Network   `json:"network"`
	Platform string    `json:"platform,omitempty"`
	Limits   Limits    `json:"limits"`
	Created  time.Time `json:"created"`
	// Dir is the sandbox's directory on the host (not stored).
	Dir string `json:"-"`
}

// ValidateName checks a sandbox name: no path tricks, a bounded length.
func ValidateName(name string) error {
	if !names.Valid(name, 64) {
		return fmt.Errorf("sandbox name %q: use 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// newID returns a runsc container ID. runsc matches IDs by prefix, so every
// ID has the same length: none can be a prefix of another.
func newID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "flmbox-" + hex.EncodeToString(b)
}

func (r *Runtime) sandboxDir(name string) string { return filepath.Join(r.dir, "sandboxes", name) }

// runc returns the go-runc driver for sb, with the same runsc global flags
// on every call of the sandbox (runsc needs them repeated).
func (r *Runtime) runc(sb *Sandbox) *runc.Runc {
	return &runc.Runc{Command: r.runsc, Root: r.runscRoot(), ExtraArgs: globalFlags(sb)}
}

func (r *Runtime) runscRoot() string { return filepath.Join(r.dir, "runsc") }

// globalFlags are runsc's global flags for sb, but --root.
func globalFlags(sb *Sandbox) []string {
	args := []string{"--network=" + string(sb.Network), "--host-uds=create"}
	if sb.Platform != "" {
		args = append(args, "--platform="+sb.Platform)
	}
	return args
}

// RunscArgs returns the arguments of a runsc command on sandbox sb of the
// Runtime whose state directory is stateDir: runsc's global flags as flmbox
// passes them, then args. It is for tools and measurements that call runsc
// directly (runsc exec).
func RunscArgs(stateDir string, sb *Sandbox, args ...string) []string {
	return append(append([]string{"--root", filepath.Join(stateDir, "runsc")}, globalFlags(sb)...), args...)
}

// Create creates and starts a sandbox. On any failure nothing of it is left.
func (r *Runtime) Create(ctx context.Context, cfg Config) (_ *Sandbox, err error) {
	if cfg.Name == "" {
		cfg.Name = "sb-" + newID()[7:19]
	}
	if err := ValidateName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.Network == "" {
		cfg.Network = NetworkNone
	}
	if _, err := ParseNetwork(string(cfg.Network)); err != nil {
		return nil, err
	}
	switch cfg.Platform {
	case "", "systrap", "ptrace", "kvm":
	default:
		return nil, fmt.Errorf("gVisor platform %q: want systrap, ptrace or kvm: %w", cfg.Platform, errdefs.ErrInvalidArgument)
	}
	dir := r.sandboxDir(cfg.Name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %q already exists; choose another name or remove it (flmbox sandbox rm %s): %w", cfg.Name, cfg.Name, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("create sandbox %q: %w", cfg.Name, err)
	}
	sb := &Sandbox{Name: cfg.Name, ID: newID(), Image: cfg.Image, Network: cfg.Network, Platform: cfg.Platform,
		Limits: cfg.Limits, Created: time.Now().UTC(), Dir: dir}
	defer func() {
		if err != nil {
			r.destroy(context.WithoutCancel(ctx), sb)
		}
	}()
	opts := append(cfg.Spec, WithNetwork(cfg.Network), WithLimits(cfg.Limits))
	if cfg.RunDir != "" {
		opt, err := sb.runDir(cfg.RunDir)
		if err != nil {
			return nil, err
		}
		opts = append(opts, opt)
	}
	spec, err := GenerateSpec(opts...)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(dir, "sandbox.json"), sb); err != nil {
		return nil, err
	}
	// runsc run hands its stdio to the sandbox's first process: give it a
	// log file of its own, so that no caller's pipe is held open.
	logf, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if sb.Network == NetworkNone {
		unlock, err := r.lockNullNetns()
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	// runsc run --detach creates and starts the sandbox in one runsc
	// process: a runsc start of its own costs 10 to 20 ms more.
	rc := r.runc(sb)
	if _, err := rc.Run(ctx, sb.ID, dir, &runc.CreateOpts{IO: &fileIO{f: logf}, Detach: true}); err != nil {
		// The directory, console.log included, is removed on this failure:
		// quote what runsc wrote there.
		return nil, fmt.Errorf("create sandbox %q with runsc: %w%s", sb.Name, err, logTail(filepath.Join(dir, "console.log")))
	}
	return sb, nil
}

// RunPath is the host path of DIR/run (see Config.RunDir).
func (sb *Sandbox) RunPath() string { return filepath.Join(sb.Dir, "run") }

// runDirSize bounds DIR/run: it is writable from inside the sandbox, by
// every process of the sandbox's user, and is on the host's disk otherwise.
const runDirSize = "size=64k,nr_inodes=64"

// runDir creates DIR/run, a small tmpfs of its own, and returns the option
// that mounts it at dst, owned by the user the spec's processes run as.
func (sb *Sandbox) runDir(dst string) (SpecOpt, error) {
	if err := os.Mkdir(sb.RunPath(), 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox run directory: %w", err)
	}
	if err := unix.Mount("tmpfs", sb.RunPath(), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, runDirSize+",mode=0700"); err != nil {
		return nil, fmt.Errorf("mount the sandbox run directory: %w", err)
	}
	return func(s *specs.Spec) error {
		if err := os.Chown(sb.RunPath(), int(s.Process.User.UID), int(s.Process.User.GID)); err != nil {
			return fmt.Errorf("chown sandbox run directory: %w", err)
		}
		return WithBind(sb.RunPath(), dst, false)(s)
	}, nil
}

// SealRunDir makes DIR/run read-only for the sandbox's processes once the
// agent has made its socket there: root's, mode 0755, so that no snippet can
// replace the socket with its own and receive the next calls' code.
func (sb *Sandbox) SealRunDir() error {
	if err := os.Chown(sb.RunPath(), 0, 0); err != nil {
		return fmt.Errorf("seal sandbox %q's run directory: %w", sb.Name, err)
	}
	if err := os.Chmod(sb.RunPath(), 0o755); err != nil {
		return fmt.Errorf("seal sandbox %q's run directory: %w", sb.Name, err)
	}
	return nil
}

// lockNullNetns serializes sandbox creation until runsc has made its shared
// network namespace for --network=none (a "null-netns" mount in its root):
// runsc creates it on first use, and two first uses at once stack two
// mounts, one of which leaks. Once it exists, creation runs in parallel.
func (r *Runtime) lockNullNetns() (func(), error) {
	if isNsfs(filepath.Join(r.dir, "runsc", "null-netns")) {
		return func() {}, nil
	}
	fd, err := unix.Open(filepath.Join(r.dir, "runsc", ".null-netns.lock"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock runsc's network namespace: %w", err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock runsc's network namespace: %w", err)
	}
	return func() { unix.Close(fd) }, nil
}

// isNsfs reports whether p is a mounted namespace file.
func isNsfs(p string) bool {
	var st unix.Statfs_t
	return unix.Statfs(p, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// Get returns the record of sandbox name.
func (r *Runtime) Get(name string) (*Sandbox, error) {
	return GetSandbox(r.dir, name)
}

// GetSandbox returns the record of sandbox name of the Runtime whose state
// directory is stateDir, without finding runsc: all that a call to a running
// sandbox needs.
func GetSandbox(stateDir, name string) (*Sandbox, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	dir := filepath.Join(stateDir, "sandboxes", name)
	var sb Sandbox
	b, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no sandbox %q (flmbox sandbox ls lists them): %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &sb); err != nil {
		return nil, fmt.Errorf("read sandbox %q: %w", name, err)
	}
	sb.Dir = dir
	return &sb, nil
}

// State asks runsc whether the sandbox's processes are alive.
func (r *Runtime) State(ctx context.Context, sb *Sandbox) State {
	c, err := r.runc(sb).State(ctx, sb.ID)
	if err != nil || c.Status != "running" || !alive(c.Pid) {
		return StateDead
	}
	return StateRunning
}

// alive reports whether process pid exists and is not a zombie (a killed
// sandbox process may wait a while to be reaped).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which ends with the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// List returns every sandbox's record, oldest first.
func (r *Runtime) List() ([]*Sandbox, error) {
	ents, err := os.ReadDir(filepath.Join(r.dir, "sandboxes"))
	if err != nil {
		return nil, err
	}
	var out []*Sandbox
	for _, e := range ents {
		if sb, err := r.Get(e.Name()); err == nil {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// Remove stops and deletes sandbox name and everything it left on the host.
// Removing a sandbox that does not exist is not an error.
func (r *Runtime) Remove(ctx context.Context, name string) error {
	sb, err := r.Get(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return r.destroy(ctx, sb)
}

// destroy kills the sandbox, deletes runsc's state and removes its
// directory.
func (r *Runtime) destroy(ctx context.Context, sb *Sandbox) error {
	rc := r.runc(sb)
	_ = rc.Kill(ctx, sb.ID, int(unix.SIGKILL), &runc.KillOpts{All: true})
	err := rc.Delete(ctx, sb.ID, &runc.DeleteOpts{Force: true})
	if err != nil && !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "not found") {
		if _, serr := rc.State(ctx, sb.ID); serr == nil {
			return fmt.Errorf("delete sandbox %q with runsc: %w", sb.Name, err)
		}
	}
	if err := unix.Unmount(sb.RunPath(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount sandbox %q's run directory: %w", sb.Name, err)
	}
	if err := os.RemoveAll(sb.Dir); err != nil {
		return fmt.Errorf("remove sandbox %q's files: %w", sb.Name, err)
	}
	return nil
}

func writeJSON(p string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// fileIO gives runsc run a file for the first process's stdout and
// stderr and /dev/null for its stdin.
type fileIO struct{ f *os.File }

func (f *fileIO) Close() error          { return nil }
func (f *fileIO) Stdin() io.WriteCloser { return nil }
func (f *fileIO) Stdout() io.ReadCloser { return nil }
func (f *fileIO) Stderr() io.ReadCloser { return nil }
func (f *fileIO) Set(cmd *exec.Cmd)     { cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, f.f, f.f }

var _ runc.IO = (*fileIO)(nil)

// logTail returns the last lines of a failed runsc run's log, if it wrote
// any, as the end of an error message.
func logTail(path string) string {
	const max = 2 << 10
	b, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return ": " + string(bytes.TrimSpace(b))
}
