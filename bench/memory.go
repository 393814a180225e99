package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/flmbox/flmbox/internal/procmem"
	"github.com/flmbox/flmbox/sandbox"
)

// spareModes are the sandboxes whose idle memory and first calls the bench
// measures side by side, each alone: flmbox's default spec, and each way of
// starting the agent's spare processes that a spec can choose.
var spareModes = []struct {
	name string
	edit func(*sandbox.Spec) // nil: the default spec
}{
	{"default", nil},
	{"lazy", func(s *sandbox.Spec) { s.LazySpares = true }},
}

// measureMemory measures, for each of spareModes, the host memory of one
// sandbox just created (its agent answering) and left idle for a while, its
// first Python and shell calls, warm calls, and its memory once idle again;
// then the memory of a bare runsc container running sleep on the same
// rootfs, measured the same way. One at a time, so that none shares pages
// with another.
func (r *runner) measureMemory(ctx context.Context) (Memory, error) {
	var rep Memory
	for _, mode := range spareModes {
		r.logf("memory: one idle sandbox (%s spares)", mode.name)
		m, err := r.idleSandbox(ctx, mode.name, mode.edit)
		if err != nil {
			return rep, err
		}
		rep.Modes = append(rep.Modes, m)
	}
	if len(rep.Modes) > 0 {
		m := rep.Modes[0]
		rep.SandboxKiB, rep.SandboxRSSKiB, rep.SandboxProcesses = m.KiB, m.RSSKiB, m.Processes
	}

	r.logf("memory: one bare runsc container")
	id := newRawID()
	defer r.deleteRaw(context.WithoutCancel(ctx), id)
	if err := r.startRaw(ctx, id); err != nil {
		return rep, err
	}
	mem, err := idleMemory(ctx, id, r.opts.Idle)
	if err != nil {
		return rep, err
	}
	rep.BareRunscKiB, rep.BareRunscRSSKiB, rep.BareRunscProcesses = mem.PSS, mem.RSS, mem.Processes
	return rep, nil
}

// idleSandbox measures one sandbox of the bench's spec, edited by edit (if
// not nil): its memory idle after its creation, its first Python call and
// its first shell call (in that order, through the Go API), warm calls of
// each language (Options.Calls each, alternating, after a call of each
// that is not measured), and its memory idle again.
func (r *runner) idleSandbox(ctx context.Context, name string, edit func(*sandbox.Spec)) (m MemoryMode, err error) {
	m.Spares = name
	spec := r.spec("bench-memory")
	if edit != nil {
		edit(&spec)
	}
	sb, err := r.m.Create(ctx, spec)
	if err != nil {
		return m, err
	}
	defer func() {
		if rerr := sb.Remove(context.WithoutCancel(ctx)); err == nil {
			err = rerr
		}
	}()
	mem, err := idleMemory(ctx, sb.ID, r.opts.Idle)
	if err != nil {
		return m, err
	}
	m.KiB, m.RSSKiB, m.Processes = mem.PSS, mem.RSS, mem.Processes
	first := map[string]*float64{sandbox.Python: &m.FirstPythonMS, sandbox.Shell: &m.FirstShellMS}
	warm := map[string][]float64{}
	for i := -1; i <= r.opts.Calls; i++ {
		for _, s := range []snippet{pythonSnippet, shellSnippet} {
			d, err := r.call(ctx, sb.Name, s)
			if err != nil {
				return m, err
			}
			switch {
			case i == -1:
				*first[s.language] = ms(d)
			case i >= 1: // the calls right after the first are not warm yet: their spares start
				warm[s.language] = append(warm[s.language], ms(d))
			}
		}
	}
	m.WarmPythonMS, m.WarmShellMS = summarize(warm[sandbox.Python]), summarize(warm[sandbox.Shell])
	if mem, err = idleMemory(ctx, sb.ID, r.opts.Idle); err != nil {
		return m, err
	}
	m.UsedKiB, m.UsedRSSKiB, m.UsedProcesses = mem.PSS, mem.RSS, mem.Processes
	return m, nil
}

// idleMemory waits for idle, then measures the host processes of the
// runsc container id.
func idleMemory(ctx context.Context, id string, idle time.Duration) (procmem.Memory, error) {
	select {
	case <-ctx.Done():
		return procmem.Memory{}, ctx.Err()
	case <-time.After(idle):
	}
	pids, err := procmem.Container(id)
	if err != nil {
		return procmem.Memory{}, err
	}
	if len(pids) == 0 {
		return procmem.Memory{}, fmt.Errorf("measure memory: no host process of container %s", id)
	}
	return procmem.Of(pids)
}
