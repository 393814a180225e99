// Package flamesim does what Flame's executor manager does with a Host-shim
// application, for tests, the demo and the benchmark; it is not a
// scheduler. It starts the application's command in a process group of its
// own, in a working directory, with FLAME_INSTANCE_ENDPOINT naming a Unix
// socket there; waits for the socket; connects to Flame's Instance service
// (flame.v1, package flamepb) over gRPC; and then makes the calls Flame
// makes, as its caller says: OnSessionEnter once, OnTaskInvoke per task
// (one at a time), OnSessionLeave; and stops the process with SIGTERM to its
// group, as Flame does.
//
// A task's input is flmexec's script as flamepy.tools.Sandbox sends it
// (Task, Script), and its output is what `flmbox instance` answers (Output,
// DecodeOutput). The package knows nothing of flmbox's own packages: it
// speaks only the protocol.
package flamesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flmbox/flmbox/instance/flamepb"
)

// EndpointEnv names the Unix socket the application is to serve on, as
// Flame's executor sets it.
const EndpointEnv = "FLAME_INSTANCE_ENDPOINT"

// SocketName is the socket's name in the application's working directory.
const SocketName = "instance.sock"

// pollInterval is how often Start looks for the socket.
const pollInterval = 2 * time.Millisecond

// waitDelay bounds how long the end of the process waits for its output
// pipes to close (something it started may hold them).
const waitDelay = 2 * time.Second

// Options are how Start runs the application.
type Options struct {
	// Dir is the application's working directory, where its socket is
	// made (Dir/instance.sock). Required: Flame gives every executor a
	// directory of its own. It must exist.
	Dir string
	// Env is added to this process's environment; FLAME_INSTANCE_ENDPOINT
	// comes last and wins.
	Env []string
	// Stdout and Stderr get the application's output (default:
	// discarded). A writer that is not an *os.File is written by another
	// goroutine while the application runs (see os/exec): to read it
	// meanwhile, make it safe for that.
	Stdout, Stderr io.Writer
	// Application is the application's name in OnSessionEnter (default
	// "flmbox").
	Application string
}

// Executor is one application process and the gRPC connection to it. Its
// calls are Flame's; Client gives the bare client for anything else (a call
// made while another runs, as a test may want).
type Executor struct {
	path   string
	socket string
	app    string
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process is reaped
	err    error         // its exit, set before exited is closed
	conn   *grpc.ClientConn
	client flamepb.InstanceClient
	closed sync.Once

	mu      sync.Mutex
	session string // entered, for the tasks' TaskContext
}

// Start starts path with args as Flame's executor does: in o.Dir, in a
// process group of its own, with FLAME_INSTANCE_ENDPOINT=o.Dir/instance.sock;
// waits until the socket accepts connections, and connects. path is found
// as exec.LookPath finds it, from this process's working directory (not
// o.Dir). ctx bounds the start only, not the process's life: that ends with
// Stop or Kill. If the process exits first, or ctx ends first (the process
// is then killed), the error says so; the process's stderr
// (Options.Stderr) says why.
func Start(ctx context.Context, path string, args []string, o Options) (*Executor, error) {
	if o.Dir == "" {
		return nil, fmt.Errorf("start %s: no working directory: %w", path, errdefs.ErrInvalidArgument)
	}
	if o.Application == "" {
		o.Application = "flmbox"
	}
	// exec would find a relative path in Dir.
	abs, err := exec.LookPath(path)
	if err == nil {
		abs, err = filepath.Abs(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	sock := filepath.Join(o.Dir, SocketName)
	cmd := exec.Command(abs, args...)
	cmd.Dir = o.Dir
	cmd.Env = append(append(os.Environ(), o.Env...), EndpointEnv+"="+sock)
	cmd.Stdout, cmd.Stderr = o.Stdout, o.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	e := &Executor{path: path, socket: sock, app: o.Application, cmd: cmd, exited: make(chan struct{})}
	go func() {
		e.err = cmd.Wait()
		close(e.exited)
	}()
	if err := waitSocket(ctx, sock, e.exited); err != nil {
		e.Kill()
		if errors.Is(err, errExited) {
			return nil, fmt.Errorf("start %s: it exited before its socket %s was ready: %w", path, sock, e.exitError())
		}
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.Kill()
		return nil, fmt.Errorf("connect to %s: %w", sock, err)
	}
	e.conn, e.client = conn, flamepb.NewInstanceClient(conn)
	return e, nil
}

// errExited is waitSocket's error when the process exited.
var errExited = errors.New("the process exited")

// waitSocket polls until the Unix socket at path accepts a connection (so
// that the first call never finds a socket file not yet listening), exited
// is closed, or ctx is done.
func waitSocket(ctx context.Context, path string, exited <-chan struct{}) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the socket %s: %w", path, context.Cause(ctx))
		case <-exited:
			return errExited
		case <-tick.C:
		}
	}
}

// Socket is the application's socket.
func (e *Executor) Socket() string { return e.socket }

// Pid is the application's process ID, also its process group's.
func (e *Executor) Pid() int { return e.cmd.Process.Pid }

// Client is the gRPC client of the application's Instance service.
func (e *Executor) Client() flamepb.InstanceClient { return e.client }

// Enter calls OnSessionEnter for session sessionID of the application
// (Options.Application) with image as the application's image ("": none)
// and commonData as the session's. An error is a failed call; the
// application's refusal is a Result whose return code is not 0 (see
// Check). The session entered names the tasks' session.
func (e *Executor) Enter(ctx context.Context, sessionID, image string, commonData []byte) (*flamepb.Result, error) {
	app := &flamepb.ApplicationContext{Name: e.app, Shim: flamepb.Shim_Host}
	if image != "" {
		app.Image = &image
	}
	res, err := e.client.OnSessionEnter(ctx, &flamepb.SessionContext{SessionId: sessionID, Application: app, CommonData: commonData})
	if err != nil {
		return nil, fmt.Errorf("OnSessionEnter %q: %w", sessionID, err)
	}
	if res.GetReturnCode() == 0 {
		e.mu.Lock()
		e.session = sessionID
		e.mu.Unlock()
	}
	return res, nil
}

// Invoke calls OnTaskInvoke for task taskID of the session entered with
// input (see Script). An error is a failed call; a task the application
// could not run is a TaskResult whose return code is not 0 (see Check and
// DecodeOutput).
func (e *Executor) Invoke(ctx context.Context, taskID string, input []byte) (*flamepb.TaskResult, error) {
	e.mu.Lock()
	session := e.session
	e.mu.Unlock()
	res, err := e.client.OnTaskInvoke(ctx, &flamepb.TaskContext{TaskId: taskID, SessionId: session, Input: input})
	if err != nil {
		return nil, fmt.Errorf("OnTaskInvoke %q: %w", taskID, err)
	}
	return res, nil
}

// Leave calls OnSessionLeave. An error is a failed call; the application's
// failure is a Result whose return code is not 0 (see Check).
func (e *Executor) Leave(ctx context.Context) (*flamepb.Result, error) {
	res, err := e.client.OnSessionLeave(ctx, &flamepb.EmptyRequest{})
	if err != nil {
		return nil, fmt.Errorf("OnSessionLeave: %w", err)
	}
	if res.GetReturnCode() == 0 {
		e.mu.Lock()
		e.session = ""
		e.mu.Unlock()
	}
	return res, nil
}

// Stop stops the application as Flame does: SIGTERM to its process group,
// then, if it has not exited within grace, SIGKILL. It returns nil if the
// process exited with status 0 (also if it did so before), else an error
// that says how it ended. It closes the connection once the process has
// exited, so that a call running meanwhile gets its answer if the
// application sends one. Calling Stop or Kill again does nothing more.
func (e *Executor) Stop(grace time.Duration) error {
	defer e.close()
	select {
	case <-e.exited:
		return e.exitError()
	default:
	}
	e.signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-e.exited:
		return e.exitError()
	case <-timer.C:
		e.signal(syscall.SIGKILL)
		<-e.exited
		return fmt.Errorf("%s did not exit within %s of SIGTERM: killed", e.path, grace)
	}
}

// Kill sends SIGKILL to the application's process group, unless it has
// exited, waits for it and closes the connection.
func (e *Executor) Kill() {
	defer e.close()
	select {
	case <-e.exited:
		return
	default:
	}
	e.signal(syscall.SIGKILL)
	<-e.exited
}

// signal sends sig to the process group. The process has not been seen to
// exit, so the group's ID is still its own.
func (e *Executor) signal(sig syscall.Signal) {
	syscall.Kill(-e.cmd.Process.Pid, sig)
}

// exitError is how the process ended, once it has: nil for status 0. A
// process that exited 0 while something it started held its output open
// (exec.ErrWaitDelay) counts as status 0.
func (e *Executor) exitError() error {
	if e.err == nil || errors.Is(e.err, exec.ErrWaitDelay) {
		return nil
	}
	return fmt.Errorf("%s: %w", e.path, e.err)
}

func (e *Executor) close() {
	e.closed.Do(func() {
		if e.conn != nil {
			e.conn.Close()
		}
	})
}
