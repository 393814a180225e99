// Package instance is flmbox as a Flame application: a server of Flame's
// Instance gRPC service (flame.v1, package flamepb) whose session is one
// sandbox and whose tasks are snippets run in it, on package sandbox.
//
// Flame's executor starts the application with FLAME_INSTANCE_ENDPOINT
// naming a Unix socket, waits for the socket, then calls OnSessionEnter
// once, OnTaskInvoke for each task (one at a time), OnSessionLeave, and
// sends SIGTERM. A task's input is flmexec's Script ({"language", "code",
// "input"}, bytes as arrays of numbers); its output keeps flmexec's
// {"data": stdout bytes} and adds the snippet's exit code, stderr and
// more, so that Flame's Python client (flamepy.tools.Sandbox) works
// unchanged.
package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	units "github.com/docker/go-units"

	"github.com/flmbox/flmbox/instance/flamepb"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/snippet/wire"
)

// Options are the operator's: the sandbox a session gets by default, which
// is also the most a session may ask for.
type Options struct {
	// Spec is the sandbox of a session that asks for nothing: its Image
	// (used when neither the session nor the application names one), its
	// limits, /tmp size and network are the most a session may ask for.
	// Its Name is ignored.
	Spec sandbox.Spec
	// Timeout is a task's timeout when neither the task nor the session
	// sets one (default sandbox.DefaultTimeout).
	Timeout time.Duration
	// Log gets one line per call (default: discarded).
	Log io.Writer
}

// Server serves one Flame executor: one session, one sandbox. The zero
// value is not usable: use New.
type Server struct {
	flamepb.UnimplementedInstanceServer
	m *sandbox.Manager
	o Options

	mu      sync.Mutex // one call at a time (Flame sends them so)
	session string     // "" when no session is entered
	name    string     // the session's sandbox
	tasks   taskDefaults
	broken  error // why the session's sandbox can take no more tasks
}

// New returns a Server that makes its sandboxes with m.
func New(m *sandbox.Manager, o Options) *Server {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Timeout <= 0 {
		o.Timeout = sandbox.DefaultTimeout
	}
	return &Server{m: m, o: o}
}

// failed is a Result for err.
func failed(err error) *flamepb.Result {
	msg := err.Error()
	return &flamepb.Result{ReturnCode: 1, Message: &msg}
}

func (s *Server) logf(start time.Time, format string, args ...any) {
	fmt.Fprintf(s.o.Log, "flmbox instance: %s (%s)\n", fmt.Sprintf(format, args...), time.Since(start).Round(time.Millisecond))
}

// OnSessionEnter acquires the session's sandbox, from the pool of its
// shape or new (see sessionSpec for what the session may choose).
func (s *Server) OnSessionEnter(ctx context.Context, sc *flamepb.SessionContext) (*flamepb.Result, error) {
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session != "" {
		s.logf(start, "enter session %q refused: session %q is entered", sc.GetSessionId(), s.session)
		return failed(fmt.Errorf("session %q is entered already: leave it first", s.session)), nil
	}
	sb, tasks, err := s.enter(ctx, sc)
	if err != nil {
		s.logf(start, "enter session %q failed: %v", sc.GetSessionId(), err)
		return failed(fmt.Errorf("enter session %q: %w", sc.GetSessionId(), err)), nil
	}
	s.session, s.name, s.tasks, s.broken = sc.GetSessionId(), sb.Name, tasks, nil
	s.logf(start, "enter session %q: sandbox %s of %s", s.session, sb.Name, sb.Image)
	return &flamepb.Result{}, nil
}

// enter makes session sc's sandbox and returns it with what its tasks take
// by default.
func (s *Server) enter(ctx context.Context, sc *flamepb.SessionContext) (*sandbox.Sandbox, taskDefaults, error) {
	spec, tasks, err := s.sessionSpec(sc)
	if err != nil {
		return nil, tasks, err
	}
	sb, err := s.m.Acquire(ctx, spec)
	return sb, tasks, err
}

// taskDefaults are what a session's tasks get when they name none.
type taskDefaults struct {
	Timeout time.Duration
	Runtime string
}

// sessionOptions are what a session may set in its common_data, a JSON
// object; sizes are numbers of bytes or strings such as "256MiB".
type sessionOptions struct {
	Image   string          `json:"image"`
	Network string          `json:"network"`
	Memory  json.RawMessage `json:"memory"`
	CPUs    float64         `json:"cpus"`
	Pids    int64           `json:"pids"`
	TmpSize json.RawMessage `json:"tmp_size"`
	Env     []string        `json:"env"`
	Pip     []string        `json:"pip"`
	Timeout float64         `json:"timeout"` // seconds, the tasks' default

	// What flamepy.tools.Sandbox sends (its SandboxAttr): the language
	// (checked), the runtime (the tasks' default), and what is Flame's
	// business (how many executors, the resources it schedules by).
	Language     string          `json:"language"`
	Runtime      *string         `json:"runtime"`
	MinInstances json.RawMessage `json:"min_instances"`
	MaxInstances json.RawMessage `json:"max_instances"`
	Resreq       json.RawMessage `json:"resreq"`
}

// sessionSpec is the sandbox of session sc: the operator's, with what the
// session's common_data asks for, if it is a JSON object, within the
// operator's bounds. The image is common_data's, else the application's,
// else the operator's.
func (s *Server) sessionSpec(sc *flamepb.SessionContext) (sandbox.Spec, taskDefaults, error) {
	spec, tasks := s.o.Spec, taskDefaults{Timeout: s.o.Timeout}
	spec.Name = ""
	spec.Ephemeral = true // a killed instance's sandbox goes at the next Reconcile
	spec.Env = append([]string(nil), spec.Env...)
	spec.Pip = append([]string(nil), spec.Pip...)
	if img := sc.GetApplication().GetImage(); img != "" {
		spec.Image = img
	}
	var so sessionOptions
	if data := sc.GetCommonData(); len(data) > 0 && strings.HasPrefix(strings.TrimSpace(string(data)), "{") {
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&so); err != nil {
			return spec, tasks, fmt.Errorf("common_data: %w: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	if so.Image != "" {
		spec.Image = so.Image
	}
	if spec.Image == "" {
		return spec, tasks, fmt.Errorf("no image: the session's common_data, the application or flmbox instance --image must name one: %w", errdefs.ErrInvalidArgument)
	}
	if so.Network != "" {
		n, err := runtime.ParseNetwork(so.Network)
		if err != nil {
			return spec, tasks, err
		}
		if n == runtime.NetworkHost && spec.Network != runtime.NetworkHost {
			return spec, tasks, fmt.Errorf("network host: this instance allows none (its operator's --network): %w", errdefs.ErrInvalidArgument)
		}
		spec.Network = n
	}
	limits := spec.Limits
	if limits == (runtime.Limits{}) {
		limits = sandbox.DefaultLimits
	}
	if err := lower("memory", so.Memory, &spec.Limits.MemoryBytes, limits.MemoryBytes); err != nil {
		return spec, tasks, err
	}
	tmp := spec.TmpBytes
	if tmp == 0 {
		tmp = sandbox.DefaultTmpBytes
	}
	if err := lower("tmp_size", so.TmpSize, &spec.TmpBytes, tmp); err != nil {
		return spec, tasks, err
	}
	if so.CPUs != 0 {
		if so.CPUs < 0 || so.CPUs > limits.CPUs {
			return spec, tasks, fmt.Errorf("cpus %g: want more than 0 and at most %g (this instance's): %w", so.CPUs, limits.CPUs, errdefs.ErrInvalidArgument)
		}
		spec.Limits.CPUs = so.CPUs
	}
	if so.Pids != 0 {
		if so.Pids < 0 || so.Pids > limits.Pids {
			return spec, tasks, fmt.Errorf("pids %d: want more than 0 and at most %d (this instance's): %w", so.Pids, limits.Pids, errdefs.ErrInvalidArgument)
		}
		spec.Limits.Pids = so.Pids
	}
	spec.Env = append(spec.Env, so.Env...)
	spec.Pip = append(spec.Pip, so.Pip...)
	if so.Timeout < 0 {
		return spec, tasks, fmt.Errorf("timeout %g: want seconds, more than 0: %w", so.Timeout, errdefs.ErrInvalidArgument)
	}
	if so.Timeout > 0 {
		tasks.Timeout = time.Duration(so.Timeout * float64(time.Second))
	}
	if l := strings.ToLower(so.Language); l != "" && l != wire.LanguagePython && l != wire.LanguageShell {
		return spec, tasks, fmt.Errorf("common_data: language %q: want python or shell: %w", so.Language, errdefs.ErrInvalidArgument)
	}
	if so.Runtime != nil {
		tasks.Runtime = *so.Runtime
	}
	return spec, tasks, nil
}

// lower sets *dst to the size raw names (bytes, or a string such as
// "256MiB"), which must be at most max; nothing if raw is empty.
func lower(name string, raw json.RawMessage, dst *int64, max int64) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var n int64
	var str string
	switch {
	case json.Unmarshal(raw, &n) == nil:
	case json.Unmarshal(raw, &str) == nil:
		v, err := units.RAMInBytes(str)
		if err != nil {
			return fmt.Errorf("%s %q: want a size such as 256MiB: %w", name, str, errdefs.ErrInvalidArgument)
		}
		n = v
	default:
		return fmt.Errorf("%s %s: want a number of bytes or a size such as \"256MiB\": %w", name, raw, errdefs.ErrInvalidArgument)
	}
	if n <= 0 || n > max {
		return fmt.Errorf("%s %d bytes: want more than 0 and at most %d (this instance's): %w", name, n, max, errdefs.ErrInvalidArgument)
	}
	*dst = n
	return nil
}

// OnSessionLeave gives the session's sandbox back (sandbox.Manager.Release:
// reset into its pool, or removed).
func (s *Server) OnSessionLeave(ctx context.Context, _ *flamepb.EmptyRequest) (*flamepb.Result, error) {
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session == "" {
		s.logf(start, "leave: no session")
		return &flamepb.Result{}, nil
	}
	session := s.session // leaveLocked clears it
	err := s.leaveLocked(ctx)
	s.logf(start, "leave session %q: %v", session, errOrOK(err))
	if err != nil {
		return failed(err), nil
	}
	return &flamepb.Result{}, nil
}

// Leave leaves the session if one is entered: for a server being stopped.
func (s *Server) Leave(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session == "" {
		return nil
	}
	return s.leaveLocked(ctx)
}

func (s *Server) leaveLocked(ctx context.Context) error {
	err := s.m.Release(ctx, s.name)
	s.session, s.name, s.broken = "", "", nil
	if err != nil {
		return fmt.Errorf("leave the session: %w", err)
	}
	return nil
}

func errOrOK(err error) any {
	if err == nil {
		return "ok"
	}
	return err
}

// ErrNoSession is in the message of a task invoked outside a session.
var ErrNoSession = fmt.Errorf("no session is entered: %w", errdefs.ErrFailedPrecondition)

// OnTaskInvoke runs the task's script in the session's sandbox (see
// Script and Output).
func (s *Server) OnTaskInvoke(ctx context.Context, tc *flamepb.TaskContext) (*flamepb.TaskResult, error) {
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out, err := s.invoke(ctx, tc)
	if err != nil {
		s.logf(start, "task %q of session %q failed: %v", tc.GetTaskId(), s.session, err)
		msg := err.Error()
		return &flamepb.TaskResult{ReturnCode: 1, Message: &msg}, nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	s.logf(start, "task %q of session %q: exit %d", tc.GetTaskId(), s.session, out.ExitCode)
	return &flamepb.TaskResult{Output: b}, nil
}

func (s *Server) invoke(ctx context.Context, tc *flamepb.TaskContext) (*Output, error) {
	if s.session == "" {
		return nil, ErrNoSession
	}
	if s.broken != nil {
		return nil, fmt.Errorf("the session's sandbox can take no more tasks: %w", s.broken)
	}
	req, err := parseScript(tc.GetInput(), s.tasks)
	if err != nil {
		return nil, err
	}
	res, err := s.m.Call(ctx, s.name, req)
	if err != nil {
		if errors.Is(err, sandbox.ErrDead) || errors.Is(err, sandbox.ErrRemoved) {
			s.broken = err
		}
		return nil, err
	}
	if res.Error != "" {
		return nil, fmt.Errorf("run the task: %s", res.Error)
	}
	return newOutput(res), nil
}
