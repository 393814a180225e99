// Package instance is flmbox as a Flame application: a server of Flame's
// Instance gRPC service (flame.v1, package flamepb) whose session is one
// sandbox and whose tasks are snippets run in it, on package sandbox.
//
// Flame's executor manager starts a new process of the application for
// each session it binds an executor to, with FLAME_INSTANCE_ENDPOINT naming
// a Unix socket; waits for the socket; calls OnSessionEnter once,
// OnTaskInvoke for each task of that session (one at a time), and
// OnSessionLeave (also after a failed OnSessionEnter); and sends SIGTERM.
//
// A task is flmexec's, byte for byte, so that Flame's Python client
// (flamepy.tools.Sandbox) and whatever was written for flmexec work
// unchanged. Its input is flmexec's Script ({"language", "code", "input",
// "runtime"}, bytes as arrays of numbers); its code runs as flmexec runs
// it, as a file, main.py or main.sh, under the runtime it names (a Python
// version such as "3.11", bash by default for shell). Its output is
// flmexec's {"data": stdout bytes}, which is all flamepy reads, and more
// (see Output): data is all of stdout, or, when that would not fit in the
// 4 MiB of one gRPC message, the longest prefix that does, never with a
// byte of flmbox's in it; stdout_truncated, stdout_bytes and stdout_tail
// say what was left out. flmexec has no timeout; a task here has one, an
// hour by default (DefaultTimeout).
package instance

import (
	"cmp"
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
	"github.com/flmbox/flmbox/internal/errkind"
	"github.com/flmbox/flmbox/sandbox"
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
	// sets one (default DefaultTimeout).
	Timeout time.Duration
	// Log gets one line per call (default: discarded).
	Log io.Writer
}

// DefaultTimeout is a task's timeout when neither the task, its session
// nor the operator (Options.Timeout) sets one. flmexec has none, and a
// task written for it may run for minutes; a sandbox must bound
// something, and an hour bounds a task stuck for good.
const DefaultTimeout = time.Hour

// Server serves one Flame executor: one session, one sandbox. The zero
// value is not usable: use New.
type Server struct {
	flamepb.UnimplementedInstanceServer
	m sandboxes
	o Options

	mu      sync.Mutex // one call at a time (Flame sends them so)
	session string     // "" when no session is entered
	name    string     // the session's sandbox
	tasks   taskDefaults
	broken  error // why the session's sandbox can take no more tasks
	// noBash says that the session's image has no bash: its shell tasks
	// that name no shell run with its /bin/sh.
	noBash bool
}

// sandboxes are what a Server does with sandboxes: *sandbox.Manager.
type sandboxes interface {
	Acquire(ctx context.Context, spec sandbox.Spec) (*sandbox.Sandbox, error)
	Call(ctx context.Context, name string, req sandbox.Request) (*sandbox.Result, error)
	Release(ctx context.Context, name string) error
}

// New returns a Server that makes its sandboxes with m.
func New(m *sandbox.Manager, o Options) *Server {
	return newServer(m, o)
}

func newServer(m sandboxes, o Options) *Server {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
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
//
// An enter while a session is entered is refused, and the session entered
// keeps its sandbox and its tasks: Flame never does that (an executor's
// process serves one session binding, left before the next is entered), so
// a second enter is a client's mistake, and taking it would lose the
// files of the session entered, or mix two sessions in one sandbox.
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
	s.session, s.name, s.tasks, s.broken, s.noBash = sc.GetSessionId(), sb.Name, tasks, nil, false
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
	Allow   []string        `json:"allow"` // egress rules, within the operator's
	Deny    []string        `json:"deny"`
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
	// The operator's spec with its defaults: what a session may lower.
	spec, err := spec.Normalize()
	if err != nil {
		return spec, tasks, err
	}
	limits := spec.Limits
	if spec, err = sessionNetwork(spec, so); err != nil {
		return spec, tasks, err
	}
	if err := lower("memory", so.Memory, &spec.Limits.MemoryBytes, limits.MemoryBytes); err != nil {
		return spec, tasks, err
	}
	if err := lower("tmp_size", so.TmpSize, &spec.TmpBytes, spec.TmpBytes); err != nil {
		return spec, tasks, err
	}
	// /tmp is memory: a session that asks for less memory than this
	// instance's /tmp gets a /tmp of its memory, unless it asked for that
	// /tmp itself.
	if mem := spec.Limits.MemoryBytes; spec.TmpBytes > mem {
		if len(so.TmpSize) != 0 && string(so.TmpSize) != "null" {
			return spec, tasks, fmt.Errorf("tmp_size %d bytes: want at most memory, %d bytes (/tmp is memory): %w", spec.TmpBytes, mem, errdefs.ErrInvalidArgument)
		}
		spec.TmpBytes = mem
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
	if l := strings.ToLower(so.Language); l != "" && l != sandbox.Python && l != sandbox.Shell {
		return spec, tasks, fmt.Errorf("common_data: language %q: want python or shell: %w", so.Language, errdefs.ErrInvalidArgument)
	}
	if so.Runtime != nil {
		tasks.Runtime = *so.Runtime
	}
	return spec, tasks, nil
}

// sessionNetwork is spec (the operator's) with the network session options
// so ask for, which may be less than the operator's and never more: none
// is always allowed, egress under an egress or host operator (under egress,
// only within its rules; its Deny rules and DNS servers stay), host only
// under host.
func sessionNetwork(spec sandbox.Spec, so sessionOptions) (sandbox.Spec, error) {
	n := spec.Network
	if so.Network != "" {
		var err error
		if n, err = sandbox.ParseNetwork(so.Network); err != nil {
			return spec, err
		}
	}
	switch {
	case n == spec.Network, n == sandbox.NetworkNone, n == sandbox.NetworkEgress && spec.Network == sandbox.NetworkHost:
	default:
		return spec, fmt.Errorf("network %s: this instance allows at most %s (its operator's --network): %w", n, spec.Network, errdefs.ErrInvalidArgument)
	}
	var asked sandbox.Egress
	for _, l := range []struct {
		in  []string
		out *[]sandbox.EgressRule
	}{{so.Allow, &asked.Allow}, {so.Deny, &asked.Deny}} {
		for _, v := range l.in {
			r, err := sandbox.ParseEgressRule(v)
			if err != nil {
				return spec, err
			}
			*l.out = append(*l.out, r)
		}
	}
	switch {
	case n != sandbox.NetworkEgress && (len(asked.Allow) > 0 || len(asked.Deny) > 0):
		return spec, fmt.Errorf("allow and deny need network egress, not %s: %w", n, errdefs.ErrInvalidArgument)
	case n != sandbox.NetworkEgress:
		spec.Egress = sandbox.Egress{}
	case spec.Network == sandbox.NetworkEgress:
		e, err := spec.Egress.Narrow(asked)
		if err != nil {
			return spec, err
		}
		spec.Egress = e
	default: // under host: the session's policy, the host's DNS
		spec.Egress = asked
	}
	spec.Network = n
	return spec, nil
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
// reset into its pool, or removed). With no session entered, as after a
// failed OnSessionEnter (Flame then leaves all the same), it succeeds.
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
var ErrNoSession = errkind.New(errdefs.ErrFailedPrecondition, "no session is entered: failed precondition")

// ErrOtherSession is in the message of a task of another session than the
// one entered: it is refused, and nothing runs. (Flame hands an executor
// only its session's tasks.)
var ErrOtherSession = errkind.New(errdefs.ErrFailedPrecondition, "the task is of another session: failed precondition")

// OnTaskInvoke runs the task's script in the session's sandbox (see
// Script and Output). A snippet that fails is a task that ran (return code
// 0, its exit code in the output); a task that could not run (bad input, a
// runtime the image lacks, another session's task, a dead sandbox) fails
// with a message.
func (s *Server) OnTaskInvoke(ctx context.Context, tc *flamepb.TaskContext) (*flamepb.TaskResult, error) {
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	res, err := s.invoke(ctx, tc)
	if err != nil {
		s.logf(start, "task %q of session %q failed: %v", tc.GetTaskId(), s.session, err)
		msg := err.Error()
		return &flamepb.TaskResult{ReturnCode: 1, Message: &msg}, nil
	}
	out, b := newOutput(res, outputBudget(len(tc.GetInput())))
	note := ""
	if out.StdoutTruncated {
		note = fmt.Sprintf(", stdout truncated to %d of %d bytes", len(out.Data), out.StdoutBytes)
	}
	s.logf(start, "task %q of session %q: exit %d%s", tc.GetTaskId(), s.session, out.ExitCode, note)
	return &flamepb.TaskResult{Output: b}, nil
}

func (s *Server) invoke(ctx context.Context, tc *flamepb.TaskContext) (*sandbox.Result, error) {
	if s.session == "" {
		return nil, ErrNoSession
	}
	if id := tc.GetSessionId(); id != "" && id != s.session {
		return nil, fmt.Errorf("task %q of session %q, not of %q, which this instance serves: %w", tc.GetTaskId(), id, s.session, ErrOtherSession)
	}
	if s.broken != nil {
		return nil, fmt.Errorf("the session's sandbox can take no more tasks: %w", s.broken)
	}
	t, err := parseScript(tc.GetInput(), s.tasks)
	if err != nil {
		return nil, err
	}
	if t.defaultShell && s.noBash {
		t.req.Interpreter = "" // the image's /bin/sh
	}
	res, err := s.call(ctx, t.req)
	if t.defaultShell && !s.noBash && missingInterpreter(err) {
		// No code ran: the agent looks for the interpreter first. The
		// image has no bash, unless the task's own PATH hid it.
		s.noBash, t.req.Interpreter = len(t.req.Env) == 0, ""
		res, err = s.call(ctx, t.req)
	}
	var nr *sandbox.NotRunError
	switch {
	case missingInterpreter(err) && errors.As(err, &nr):
		// "interpreter 3.12: the sandbox has no python3.12 ...", as the
		// task named it.
		return nil, fmt.Errorf("runtime %s:%s", cmp.Or(t.runtime, t.req.Interpreter), strings.TrimPrefix(nr.Reason, "interpreter "+t.req.Interpreter+":"))
	case errors.As(err, &nr):
		return nil, fmt.Errorf("run the task: %s", nr.Reason)
	case err != nil:
		return nil, err
	}
	return res, nil
}

// call runs req in the session's sandbox; a sandbox found dead or removed
// takes no more tasks.
func (s *Server) call(ctx context.Context, req sandbox.Request) (*sandbox.Result, error) {
	res, err := s.m.Call(ctx, s.name, req)
	if errors.Is(err, sandbox.ErrDead) || errors.Is(err, sandbox.ErrRemoved) {
		s.broken = err
	}
	return res, err
}

// missingInterpreter says whether err is the sandbox's refusal of a call
// whose interpreter it could not find: no code ran.
func missingInterpreter(err error) bool { return errors.Is(err, sandbox.ErrNoInterpreter) }
