package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/flmbox/flmbox/sandbox"
)

// Long is code that runs for seconds: its own time, as
// it measures it (perf_counter around the work), as a flmbox call in the
// bench's persistent sandbox (flmbox's defaults: one CPU's quota, 512 MiB),
// by runsc exec in that same sandbox, and by runsc exec in a bare runsc
// container of flmbox's spec (sandbox.BareSpec), each measured in turn,
// rotating which goes first. The call's figure holds all that flmbox does
// while code runs (the agent's memory watch above all); bare runsc's, what
// flmbox shows the sandbox (its CPUs: OpenBLAS sizes its threads by them).
type Long struct {
	// Python is a pure-Python loop.
	Python LongWork `json:"python"`
	// Numpy is numpy's SVD of a square matrix of normal numbers; nil when
	// the image has no numpy (NumpyMissing says why).
	Numpy        *LongWork `json:"numpy,omitempty"`
	NumpyMissing string    `json:"numpy_missing,omitempty"`
}

// LongWork is one long piece of code, timed by itself, in milliseconds.
type LongWork struct {
	Work        string `json:"work"`
	FlmboxMS    Stats  `json:"flmbox_ms"`
	RunscExecMS Stats  `json:"runsc_exec_ms"`
	BareRunscMS Stats  `json:"bare_runsc_ms"`
	// CPUs is os.cpu_count() in the sandbox and in the bare container.
	CPUs     int `json:"cpus"`
	BareCPUs int `json:"bare_cpus"`
}

// longWork is a piece of code that prints the seconds its work took and
// os.cpu_count(), and what it is.
type longWork struct {
	what, code string
}

// longPython is a loop of n iterations of pure Python (60M: some 3.5 s
// under gVisor on a 2-core VM).
func longPython(n int) longWork {
	return longWork{fmt.Sprintf("pure-Python loop of %d iterations", n), fmt.Sprintf(`import os, time
t = time.perf_counter()
x = 0
for i in range(%d):
    x += i
print(time.perf_counter() - t, os.cpu_count())
`, n)}
}

// longNumpy is numpy's SVD of an n×n matrix (1000: some 2.5 s on one CPU).
func longNumpy(n int) longWork {
	return longWork{fmt.Sprintf("numpy SVD of %d×%d", n, n), fmt.Sprintf(`import os, time
import numpy
a = numpy.random.default_rng(0).standard_normal((%d, %d))
t = time.perf_counter()
numpy.linalg.svd(a)
print(time.perf_counter() - t, os.cpu_count())
`, n, n)}
}

// longRounds is how many times each method runs each long work: 5 in the
// full protocol, 3 with --quick.
func (o Options) longRounds() int { return min(o.Pairs, 5) }

// longSizes are the loop's iterations and the matrix's side: quick ones
// under a second, full ones of some 3 seconds.
func (o Options) longSizes() (loop, matrix int) {
	if o.Pairs < 12 {
		return 5_000_000, 400
	}
	return 50_000_000, 1000
}

// measureLong measures Long in sb, the bench's persistent sandbox, and in a
// bare runsc container it makes and deletes.
func (r *runner) measureLong(ctx context.Context, sb *sandbox.Sandbox) (Long, error) {
	var rep Long
	if err := r.writeRawBundle(); err != nil {
		return rep, err
	}
	id := newRawID()
	defer r.deleteRaw(context.WithoutCancel(ctx), id)
	if err := r.startRaw(ctx, id); err != nil {
		return rep, err
	}
	loop, matrix := r.opts.longSizes()
	r.logf("long calls: %s", longPython(loop).what)
	var err error
	if rep.Python, err = r.measureLongWork(ctx, sb, id, longPython(loop)); err != nil {
		return rep, err
	}
	res, err := sb.Call(ctx, sandbox.Request{Language: sandbox.Python, Code: "import numpy", Timeout: sandbox.DefaultTimeout, MaxOutput: sandbox.DefaultMaxOutput})
	if err != nil {
		return rep, fmt.Errorf("look for numpy: %w", err)
	}
	if res.ExitCode != 0 {
		rep.NumpyMissing = "the image has no numpy: " + lastLines(string(res.Stderr.Data), 1)
		return rep, nil
	}
	w := longNumpy(matrix)
	r.logf("long calls: %s", w.what)
	numpy, err := r.measureLongWork(ctx, sb, id, w)
	if err != nil {
		return rep, err
	}
	rep.Numpy = &numpy
	return rep, nil
}

// measureLongWork runs w longRounds times each as a call in sb, by runsc
// exec in sb and in the bare container bare, rotating which goes first.
func (r *runner) measureLongWork(ctx context.Context, sb *sandbox.Sandbox, bare string, w longWork) (LongWork, error) {
	rep := LongWork{Work: w.what}
	argv := []string{"python3", "-c", w.code}
	methods := []struct {
		times []float64
		cpus  *int
		run   func(context.Context) (string, error)
	}{
		{cpus: &rep.CPUs, run: func(ctx context.Context) (string, error) {
			res, err := sb.Call(ctx, sandbox.Request{Language: sandbox.Python, Code: w.code, Timeout: sandbox.MaxTimeout, MaxOutput: sandbox.DefaultMaxOutput})
			if err != nil {
				return "", err
			}
			if res.ExitCode != 0 {
				return "", fmt.Errorf("exit %d: %s", res.ExitCode, lastLines(string(res.Stderr.Data), 1))
			}
			return string(res.Stdout.Data), nil
		}},
		{cpus: new(int), run: func(ctx context.Context) (string, error) {
			rc, err := r.sandboxRunc(sb)
			if err != nil {
				return "", err
			}
			_, out, _, err := r.runscExec(ctx, rc, sb.ID, argv)
			return out, err
		}},
		{cpus: &rep.BareCPUs, run: func(ctx context.Context) (string, error) {
			_, out, _, err := r.runscExec(ctx, r.rawRunc(), bare, argv)
			return out, err
		}},
	}
	names := []string{"flmbox call", "runsc exec", "bare runsc exec"}
	for round := range r.opts.longRounds() {
		for j := range methods {
			k := (round + j) % len(methods)
			m := &methods[k]
			out, err := m.run(ctx)
			if err != nil {
				return rep, fmt.Errorf("%s, %s: %w", w.what, names[k], err)
			}
			var secs float64
			if f := strings.Fields(out); len(f) == 2 {
				secs, err = strconv.ParseFloat(f[0], 64)
				if err == nil {
					*m.cpus, err = strconv.Atoi(f[1])
				}
			} else {
				err = fmt.Errorf("want its seconds and CPUs, got %q", out)
			}
			if err != nil {
				return rep, fmt.Errorf("%s, %s: %w", w.what, names[k], err)
			}
			m.times = append(m.times, secs*1000)
		}
	}
	rep.FlmboxMS, rep.RunscExecMS, rep.BareRunscMS = summarize(methods[0].times), summarize(methods[1].times), summarize(methods[2].times)
	return rep, nil
}
