package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"

	"github.com/flmbox/flmbox/internal/runcmonitor"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/mountinfo"
)

// Runtime runs runsc containers whose runsc state lives under one
// directory (runsc's --root), so that they outlive the process that
// started them. It knows containers by their Container only: what they are
// for, and where their bundles live, is its caller's business.
type Runtime struct {
	runsc string
	root  string // runsc's --root
	// bounds replaces the default bounds of runsc commands (by command),
	// for tests.
	bounds map[string]time.Duration
}

// NewRuntime returns a Runtime using the runsc binary at runsc, with runsc's
// state under root.
func NewRuntime(runsc, root string) (*Runtime, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create runsc's state directory: %w", err)
	}
	return &Runtime{runsc: runsc, root: root}, nil
}

// Container is what every runsc command on one container repeats: its ID
// and runsc's global flags for it.
type Container struct {
	// ID is runsc's container ID (NewID).
	ID string
	// Network is the network mode (--network).
	Network Network
	// Platform is gVisor's platform (systrap, ptrace, kvm); empty: runsc's
	// default.
	Platform string
}

// NewID returns a container ID. runsc matches IDs by prefix, so every ID
// has the same length: none can be a prefix of another.
func NewID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "flmbox-" + hex.EncodeToString(b)
}

// globalFlags are runsc's global flags for c, but --root. --host-uds=create
// lets the container's processes create Unix sockets in bind-mounted host
// directories, which the host connects to.
func globalFlags(c Container) []string {
	args := []string{"--network=" + string(c.Network), "--host-uds=create"}
	if c.Platform != "" {
		args = append(args, "--platform="+c.Platform)
	}
	return args
}

// Args returns the arguments of a runsc command on c: runsc's global flags
// as the Runtime passes them, then args. It is for tools and measurements
// that run runsc themselves (runsc exec).
func (r *Runtime) Args(c Container, args ...string) []string {
	return append(append([]string{"--root", r.root}, globalFlags(c)...), args...)
}

// Runsc is the runsc binary the Runtime runs.
func (r *Runtime) Runsc() string { return r.runsc }

// Run writes spec into the bundle directory as config.json and creates and
// starts the container with one runsc run --detach (one runsc process
// fewer than runsc create and runsc start), from a copy of the spec with the
// memory the sandbox is shown, its own limit set in its cgroup before Run
// returns (see bootBundle). runsc hands its stdio to the
// container's first process: it gets log, so that no caller's pipe is held
// open. A platform this host cannot run is refused before runsc runs
// (ValidatePlatform). On failure the error quotes the end of log, and the
// container is deleted (see cleanUp); a runsc run that does not finish in
// its bound is killed (a *TimeoutError). It returns the pid of the
// container's gVisor sandbox process (runsc's --pid-file): while that
// process lives, so does the container.
func (r *Runtime) Run(ctx context.Context, c Container, bundle string, spec *specs.Spec, log *os.File) (pid int, err error) {
	if err := ValidatePlatform(c.Platform); err != nil {
		return 0, err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return 0, fmt.Errorf("write the container's bundle: %w", err)
	}
	dir, after, err := bootBundle(bundle, c.ID, "")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	pidFile, err := filepath.Abs(filepath.Join(dir, pidFileName))
	if err != nil {
		return 0, err
	}
	unlock, err := r.lockCreate()
	if err != nil {
		return 0, err
	}
	defer unlock()
	err = r.call(ctx, "run", func(ctx context.Context) error {
		_, err := r.runc(c, true).Run(ctx, c.ID, dir, &runc.CreateOpts{IO: runcmonitor.FileIO{F: log}, PidFile: pidFile, Detach: true})
		return err
	})
	if err != nil {
		r.cleanUp(ctx, c)
		return 0, fmt.Errorf("run container with runsc: %w%s", err, logTail(log.Name()))
	}
	if pid, err = readPidFile(pidFile); err != nil {
		r.cleanUp(ctx, c)
		return 0, fmt.Errorf("run container with runsc: read its pid file: %w: %w", err, errdefs.ErrUnavailable)
	}
	if err := after.apply(pid); err != nil {
		r.cleanUp(ctx, c)
		return 0, fmt.Errorf("run container with runsc: %w", err)
	}
	return pid, nil
}

// pidFileName is the file in a bundle directory where runsc writes the pid
// of the container's gVisor sandbox process (read, then removed).
const pidFileName = "runsc.pid"

// cleanUpBound is how long the clean-up of a container that runsc failed
// to make may take, whatever its caller's context says: a caller
// interrupted by a signal ends within it.
const cleanUpBound = 10 * time.Second

// cleanUp deletes container c, which runsc failed to make or restore
// (perhaps because ctx ended), within cleanUpBound: its processes are
// killed and its cgroups removed even if runsc does not answer.
func (r *Runtime) cleanUp(ctx context.Context, c Container) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanUpBound)
	defer cancel()
	if r.Delete(ctx, c) != nil {
		r.killProcesses(c.ID)
	}
}

// createLock is the lock file that container creation holds shared and
// Prune exclusively.
const createLock = ".null-netns.lock"

// lockCreate locks runsc's root for a container's creation: shared, so
// that creations run in parallel and Prune waits, but exclusive until
// runsc has made its shared network namespace for --network=none (a
// "null-netns" mount in its root): runsc creates it on first use, and two
// first uses at once stack two mounts, one of which leaks.
func (r *Runtime) lockCreate() (func(), error) {
	fd, err := unix.Open(filepath.Join(r.root, createLock), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock runsc's state directory: %w", err)
	}
	how := unix.LOCK_SH
	for {
		if err := unix.Flock(fd, how); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("lock runsc's state directory: %w", err)
		}
		if how == unix.LOCK_EX || mountinfo.IsNsfs(filepath.Join(r.root, "null-netns")) {
			return func() { unix.Close(fd) }, nil
		}
		how = unix.LOCK_EX // converted, not atomically: two converting at once is fine
	}
}

// Prune removes what runsc leaves in its root once its last container is
// gone, so that the root can be removed: the null-netns mount and file, and
// lock files and sockets of containers whose state is gone (and the
// processes a killed runsc run left, if any). It does so only
// if idle, called with creation locked out, says that no container can be
// made or running (its caller's records say so), and only if no container
// state is left in the root; it does nothing while a container is being
// created.
func (r *Runtime) Prune(idle func() bool) error {
	fd, err := unix.Open(filepath.Join(r.root, createLock), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("prune runsc's state directory: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil // a creation runs: there is a container
	}
	if !idle() {
		return nil
	}
	ents, err := os.ReadDir(r.root)
	if err != nil {
		return fmt.Errorf("prune runsc's state directory: %w", err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".state") {
			return nil // runsc knows a container: leave its files
		}
	}
	// No container can be running: a runsc process of the root is one a
	// killed runsc run left, whose lock file (see KillOrphans) is removed
	// below.
	if _, err := r.KillOrphans(nil, func() []string { return nil }); err != nil {
		return fmt.Errorf("prune runsc's state directory: %w", err)
	}
	netns := filepath.Join(r.root, "null-netns")
	if mountinfo.IsNsfs(netns) {
		if err := unix.Unmount(netns, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount runsc's network namespace: %w", err)
		}
	}
	for _, e := range ents {
		n := e.Name()
		if n == "null-netns" || n != createLock && (strings.HasSuffix(n, ".lock") || strings.HasSuffix(n, ".sock")) {
			if err := os.Remove(filepath.Join(r.root, n)); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("prune runsc's state directory: %w", err)
			}
		}
	}
	return nil
}

// Alive asks runsc whether the container's processes are alive. It says
// false also when runsc could not tell (it failed or did not answer in
// time): Running tells those apart.
func (r *Runtime) Alive(ctx context.Context, c Container) bool {
	ok, err := r.Running(ctx, c)
	return err == nil && ok
}

// Running asks runsc whether the container's processes are alive (runsc
// state, whose sandbox process must not be a zombie). A container that
// runsc does not know is not running. An error says that runsc could not
// tell: it failed, did not answer within its bound (a *TimeoutError; a
// runsc command that hangs on the container may hold its lock), or ctx
// ended; the container may well be alive.
func (r *Runtime) Running(ctx context.Context, c Container) (bool, error) {
	s, err := r.state(ctx, c)
	if notExist(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("state of container %s: %w", c.ID, err)
	}
	return s.Status == "running" && alive(s.Pid), nil
}

// state is runsc state of c.
func (r *Runtime) state(ctx context.Context, c Container) (s *runc.Container, err error) {
	err = r.call(ctx, "state", func(ctx context.Context) error {
		s, err = r.runc(c, false).State(ctx, c.ID)
		return err
	})
	return s, err
}

// notExist says whether err is runsc's failure on a container it does
// not know.
func notExist(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && (strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found"))
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

// Delete kills the container's processes and deletes runsc's state of it
// and its cgroups. Processes that runsc does not know (a runsc run or
// restore killed while it made the container leaves its sandbox and gofer
// running, with no state or an unfinished one) are killed too, and so are
// the processes of a sandbox that does not answer runsc kill within its
// bound (runsc delete would wait on it as long). Deleting a container that
// does not exist is not an error; a ctx done before runsc said so is, and
// so is a runsc delete that did not finish (a *TimeoutError: the
// container's processes are killed all the same, its state in runsc's root
// is left for a later Delete).
func (r *Runtime) Delete(ctx context.Context, c Container) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete container %s: %w", c.ID, ctxErr(ctx))
	}
	kerr := r.call(ctx, "kill", func(ctx context.Context) error {
		return r.runc(c, false).Kill(ctx, c.ID, int(unix.SIGKILL), &runc.KillOpts{All: true})
	})
	var timeout *TimeoutError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("delete container %s: %w", c.ID, kerr)
	case errors.As(kerr, &timeout):
		r.killProcesses(c.ID)
	}
	err := r.call(ctx, "delete", func(ctx context.Context) error {
		return r.runc(c, false).Delete(ctx, c.ID, &runc.DeleteOpts{Force: true})
	})
	switch {
	case err == nil || notExist(err):
	case ctx.Err() != nil:
		return fmt.Errorf("delete container %s with runsc: %w", c.ID, err)
	case errors.As(err, &timeout):
		r.killProcesses(c.ID)
		return fmt.Errorf("delete container %s with runsc: %w", c.ID, err)
	default:
		if _, serr := r.state(ctx, c); serr == nil {
			return fmt.Errorf("delete container %s with runsc: %w", c.ID, err) // runsc still knows it
		}
	}
	if err := r.killProcesses(c.ID); err != nil {
		return fmt.Errorf("delete container %s: list its processes: %w", c.ID, err)
	}
	return removeCgroups(cgroupName("", c.ID)) // flmbox's specs have no cgroupsPath
}

// killProcesses SIGKILLs the runsc sandbox and gofer processes of
// container id.
func (r *Runtime) killProcesses(id string) error {
	procs, err := r.processes()
	if err != nil {
		return err
	}
	killContainers(procs, func(cid string) bool { return cid == id })
	return nil
}

// List returns the IDs of the containers runsc knows under the Runtime's
// root: the names of its state files (ID_sandbox:SANDBOX-ID.state), read
// without running runsc (runsc list would load every one of them: tens of
// milliseconds for tens of containers); runsc list if a name is not of
// that form.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	if ids, ok := r.stateIDs(); ok {
		return ids, nil
	}
	var cs []*runc.Container
	err := r.call(ctx, "list", func(ctx context.Context) (err error) {
		cs, err = (&runc.Runc{Command: r.runsc, Root: r.root, Setpgid: true}).List(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list containers with runsc: %w", err)
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// stateIDs returns the container IDs that name the state files in runsc's
// root, and false if one of them is not named as this runsc names them.
func (r *Runtime) stateIDs() ([]string, bool) {
	ents, err := os.ReadDir(r.root)
	if err != nil && !os.IsNotExist(err) {
		return nil, false
	}
	ids := []string{}
	for _, e := range ents {
		id, ok := rootFileID(e.Name(), ".state")
		if !ok && id != "" {
			return nil, false
		}
		if ok {
			ids = append(ids, id)
		}
	}
	return ids, true
}

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
