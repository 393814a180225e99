package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/flmbox/flmbox/internal/testrig/flamesim"
	"github.com/flmbox/flmbox/sandbox"
)

// instanceStopGrace bounds an instance's exit after SIGTERM (it leaves its
// session: the sandbox is removed).
const instanceStopGrace = 30 * time.Second

// flameInstance is one `flmbox instance` process under flamesim, as Flame's
// executor runs it, with its stderr for errors.
type flameInstance struct {
	*flamesim.Executor
	stderr *lockedBuffer
	task   int // the last task's ID
}

// startInstance starts `flmbox instance --image REF` on the private root, as
// Flame's executor starts an application, and waits for its socket.
func (r *runner) startInstance(ctx context.Context) (*flameInstance, error) {
	dir, err := os.MkdirTemp(r.dir, "flame-")
	if err != nil {
		return nil, fmt.Errorf("create an instance's directory: %w", err)
	}
	in := &flameInstance{stderr: &lockedBuffer{}}
	args := []string{"--root", r.root, "--runsc", r.runsc, "instance", "--image", r.ref}
	if in.Executor, err = flamesim.Start(ctx, r.flmboxBin, args, flamesim.Options{Dir: dir, Stderr: in.stderr}); err != nil {
		return nil, in.failed(fmt.Errorf("flmbox instance: %w", err))
	}
	return in, nil
}

// enter enters a session of the instance's default sandbox.
func (in *flameInstance) enter(ctx context.Context) error {
	res, err := in.Enter(ctx, "bench", "", nil)
	if err == nil {
		err = flamesim.Check(res)
	}
	if err != nil {
		return in.failed(fmt.Errorf("flmbox instance: enter a session: %w", err))
	}
	return nil
}

// invoke runs s as the session's next task and returns how long
// OnTaskInvoke took; the output must be exactly wantOutput.
func (in *flameInstance) invoke(ctx context.Context, s snippet) (time.Duration, error) {
	in.task++
	input := flamesim.Script(s.language, s.code)
	start := time.Now()
	res, err := in.Invoke(ctx, fmt.Sprint(in.task), input)
	d := time.Since(start)
	if err != nil {
		return d, in.failed(fmt.Errorf("flmbox instance: %w", err))
	}
	out, err := flamesim.DecodeOutput(res)
	if err != nil {
		return d, in.failed(fmt.Errorf("flmbox instance: task %d: %w", in.task, err))
	}
	if stderr := out.Stderr; out.ExitCode != 0 || stderr != "" {
		return d, fmt.Errorf("check the result of flmbox instance's task %d: exit %d, stderr %q", in.task, out.ExitCode, stderr)
	}
	return d, checkOutput(fmt.Sprintf("flmbox instance's task %d", in.task), string(out.Data), wantOutput)
}

// stop stops the instance as Flame does (SIGTERM: it leaves the session),
// which must exit 0.
func (in *flameInstance) stop() error {
	if err := in.Stop(instanceStopGrace); err != nil {
		return fmt.Errorf("stop flmbox instance: %w: %s", err, lastLines(in.stderr.String(), 5))
	}
	return nil
}

// failed is err with the end of the instance's stderr.
func (in *flameInstance) failed(err error) error {
	if s := in.stderr.String(); s != "" {
		return fmt.Errorf("%w: %s", err, lastLines(s, 5))
	}
	return err
}

// lockedBuffer is a process's output, read while the process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// instanceFirstResult is one new instance until its first result.
type instanceFirstResult struct {
	total, socket, enter time.Duration
}

// instanceFirstResult times a new `flmbox instance` process from its start
// until its first task's result is back: its socket, OnSessionEnter (which
// creates the session's sandbox) and OnTaskInvoke of the Python snippet.
// Stopping it (SIGTERM, the sandbox removed) is not timed.
func (r *runner) instanceFirstResult(ctx context.Context) (_ instanceFirstResult, err error) {
	var t instanceFirstResult
	start := time.Now()
	in, err := r.startInstance(ctx)
	if err != nil {
		return t, err
	}
	defer func() { err = errors.Join(err, in.stop()) }()
	t.socket = time.Since(start)
	if err := in.enter(ctx); err != nil {
		return t, err
	}
	t.enter = time.Since(start) - t.socket
	if _, err := in.invoke(ctx, pythonSnippet); err != nil {
		return t, err
	}
	t.total = time.Since(start)
	return t, nil
}

// measureInstance measures `flmbox instance`, flmbox as a Flame
// application under flamesim: Pairs pairs of a new instance until its first
// result and `flmbox run --image` (FreshMS's method), in alternating order,
// after one pair that is not measured; then warm tasks of one session
// against warm calls of `flmbox run --sandbox` on sb, a sandbox of the same
// spec, alternating as measureWarm's methods do.
func (r *runner) measureInstance(ctx context.Context, sb *sandbox.Sandbox) (Instance, error) {
	var rep Instance
	var total, socket, enter, fresh []float64
	for i := -1; i < r.opts.Pairs; i++ {
		if i >= 0 {
			r.logf("flmbox instance: pair %d of %d", i+1, r.opts.Pairs)
		}
		for j := range 2 {
			if (max(i, 0)+j)%2 == 0 {
				t, err := r.instanceFirstResult(ctx)
				if err != nil {
					return rep, fmt.Errorf("instance enter to first result: %w", err)
				}
				if i >= 0 {
					total, socket, enter = append(total, ms(t.total)), append(socket, ms(t.socket)), append(enter, ms(t.enter))
				}
				continue
			}
			d, err := r.freshCLI(ctx)
			if err != nil {
				return rep, fmt.Errorf("instance enter to first result (flmbox run --image): %w", err)
			}
			if i >= 0 {
				fresh = append(fresh, ms(d))
			}
		}
	}
	rep.EnterFirstResultMS, rep.SocketMS, rep.EnterMS, rep.FreshMS = summarize(total), summarize(socket), summarize(enter), summarize(fresh)
	var err error
	rep.Warm, err = r.measureInstanceWarm(ctx, sb)
	return rep, err
}

// measureInstanceWarm measures warm tasks in one session of one instance,
// for each language, against `flmbox run --sandbox` on sb.
func (r *runner) measureInstanceWarm(ctx context.Context, sb *sandbox.Sandbox) (_ []InstanceWarm, err error) {
	in, err := r.startInstance(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, in.stop()) }()
	if err := in.enter(ctx); err != nil {
		return nil, err
	}
	var out []InstanceWarm
	for _, s := range []snippet{pythonSnippet, shellSnippet} {
		methods := []*warmMethod{
			{name: "OnTaskInvoke", call: func(ctx context.Context) (time.Duration, error) { return in.invoke(ctx, s) }},
			{name: "flmbox run --sandbox", call: func(ctx context.Context) (time.Duration, error) {
				return checkedCommand(r.flmbox(ctx, "run", "--sandbox", sb.Name, "--language", s.language, "-c", s.code))
			}},
		}
		r.logf("flmbox instance: warm tasks, %s", s.language)
		if err := r.runWarm(ctx, methods); err != nil {
			return nil, err
		}
		w := InstanceWarm{Language: s.language, Calls: r.opts.Rounds * r.opts.Calls}
		w.MedianMS, w.P95MS = roundSummary(methods[0].rounds)
		w.CLIMedianMS, w.CLIP95MS = roundSummary(methods[1].rounds)
		out = append(out, w)
	}
	return out, nil
}
