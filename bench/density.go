package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/procmem"
	"github.com/flmbox/flmbox/internal/workers"
	"github.com/flmbox/flmbox/sandbox"
)

// The density section makes Options.Density idle sandboxes one
// after another, measuring at every tenth of them (and at the first) what
// each costs the host and what the count costs every sandbox: host memory
// (MemAvailable's drop, and the PSS of their processes), creates, listing,
// warm calls on random ones, idle CPU, host tasks and file descriptors. It
// does so with flmbox's default spares, then with lazy spares, then for
// Options.DensitySuspended sandboxes each suspended right after its create
// (disk, suspend, and the resume of a random one by its next call).

// maxDensity bounds Options.Density and DensitySuspended.
const maxDensity = 10000

// The measurements taken at each point: a few of each, not hundreds, so that
// a series of 500 takes minutes.
const (
	densityLists      = 5 // Manager.List
	densityCLILists   = 3 // flmbox sandbox ls --json
	densityCallees    = 5 // random sandboxes called at each point
	densityCalls      = 10
	densityCLICalls   = 5
	densityResumes    = 3 // of each kind: in process, CLI
	densityCPUWindow  = 2 * time.Second
	densityCheckCalls = 4 // calls at once in the all-answering check
	// densityAlone is the number of creates (and suspends) of the first
	// point, one sandbox alive: the baseline of the ratios.
	densityAlone = 5
)

// densityPoints are the counts at which a series of n measures: 1, then
// every tenth of n (rounded up), n last.
func densityPoints(n int) []int {
	if n <= 0 {
		return nil
	}
	pts := []int{1}
	for k := 1; k <= 10; k++ {
		if p := (n*k + 9) / 10; p > pts[len(pts)-1] {
			pts = append(pts, p)
		}
	}
	return pts
}

// measureDensity runs the density section: the limits are checked again (others
// may have used memory since Run began), then the three series.
func (r *runner) measureDensity(ctx context.Context) (*Density, error) {
	n, m := r.opts.Density, r.opts.densitySuspended()
	lim, err := readLimits(r.root)
	if err != nil {
		return nil, err
	}
	if err := lim.check(n, m); err != nil {
		return nil, err
	}
	rep := &Density{Sandboxes: n, Suspended: m, Limits: lim}
	for _, lazy := range []bool{false, true} {
		s, err := r.densityRunning(ctx, n, lazy)
		rep.Series = append(rep.Series, s)
		if err != nil {
			return rep, err
		}
	}
	s, err := r.densitySuspended(ctx, m)
	rep.Series = append(rep.Series, s)
	return rep, err
}

// densitySuspended is Options.DensitySuspended, Density if 0.
func (o Options) densitySuspended() int {
	if o.DensitySuspended > 0 {
		return o.DensitySuspended
	}
	return o.Density
}

// densityState is a series at work: its sandboxes so far, and the host
// before the first.
type densityState struct {
	name    string
	sbs     []*sandbox.Sandbox
	memKiB  int64 // MemAvailable before the first
	creates []float64
	suspend []float64
}

// newDensityState starts a series: MemAvailable once the host has settled.
func (r *runner) newDensityState(ctx context.Context, name string) (*densityState, error) {
	if err := sleepCtx(ctx, r.opts.Idle); err != nil {
		return nil, err
	}
	mem, err := memAvailable()
	if err != nil {
		return nil, err
	}
	return &densityState{name: name, memKiB: mem}, nil
}

// sleepCtx waits for d or ctx.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// densityRunning makes n idle sandboxes one after another (lazy: with
// lazy spares), measuring at each of densityPoints, then calls each and
// removes them all (also on error or interrupt).
func (r *runner) densityRunning(ctx context.Context, n int, lazy bool) (rep DensitySeries, err error) {
	rep.Name = "default"
	if lazy {
		rep.Name = "lazy"
	}
	st, err := r.newDensityState(ctx, rep.Name+" spares")
	if err != nil {
		return rep, err
	}
	defer func() {
		rm, rerr := r.removeAll(context.WithoutCancel(ctx), st)
		rep.RemoveMS = summarize(rm)
		err = errors.Join(err, rerr)
	}()
	// The first point's creates: densityAlone, each with no other
	// sandbox of the series alive, the last of them kept.
	for i := 1; i < densityAlone; i++ {
		spec := r.spec(fmt.Sprintf("bench-density-%s-alone-%d", rep.Name, i))
		spec.LazySpares = lazy
		if err := r.createAlone(ctx, st, spec, false); err != nil {
			return rep, err
		}
	}
	points := densityPoints(n)
	for i := 1; i <= n; i++ {
		if i%10 == 0 {
			if err := guardMemory(i - 1); err != nil {
				return rep, err
			}
		}
		spec := r.spec(fmt.Sprintf("bench-density-%s-%d", rep.Name, i))
		spec.LazySpares = lazy
		start := time.Now()
		sb, err := r.m.Create(ctx, spec)
		if err != nil {
			return rep, fmt.Errorf("density (%s spares): sandbox %d of %d: %w", rep.Name, i, n, err)
		}
		st.creates = append(st.creates, ms(time.Since(start)))
		st.sbs = append(st.sbs, sb)
		if !slices.Contains(points, i) {
			continue
		}
		r.logf("density (%s spares): %d of %d sandboxes", rep.Name, i, n)
		p, err := r.densityPoint(ctx, st, false)
		if err != nil {
			return rep, err
		}
		rep.Points = append(rep.Points, p)
	}
	r.logf("density (%s spares): a call to each of the %d sandboxes", rep.Name, n)
	rep.Checked, rep.NotAnswering, rep.FirstFailure = r.checkAnswering(ctx, st.sbs)
	return rep, ctx.Err()
}

// densitySuspended makes m sandboxes one after another, each suspended
// right after its create (so at most one runs at a time, and the one a
// resume brings back), measuring at each of densityPoints; then resumes,
// calls and removes each (also on error or interrupt: removes).
func (r *runner) densitySuspended(ctx context.Context, m int) (rep DensitySeries, err error) {
	rep.Name = "suspended"
	st, err := r.newDensityState(ctx, rep.Name)
	if err != nil {
		return rep, err
	}
	defer func() {
		// What the check did not remove (an error or interrupt came first).
		rm, rerr := r.removeAll(context.WithoutCancel(ctx), st)
		if rep.RemoveMS.N == 0 {
			rep.RemoveMS = summarize(rm)
		}
		err = errors.Join(err, rerr)
	}()
	for i := 1; i < densityAlone; i++ {
		if err := r.createAlone(ctx, st, r.spec(fmt.Sprintf("bench-density-suspended-alone-%d", i)), true); err != nil {
			return rep, err
		}
	}
	points := densityPoints(m)
	for i := 1; i <= m; i++ {
		if i%10 == 0 {
			if err := guardMemory(i - 1); err != nil {
				return rep, err
			}
		}
		start := time.Now()
		sb, err := r.m.Create(ctx, r.spec(fmt.Sprintf("bench-density-suspended-%d", i)))
		if err != nil {
			return rep, fmt.Errorf("density (suspended): sandbox %d of %d: %w", i, m, err)
		}
		st.creates = append(st.creates, ms(time.Since(start)))
		st.sbs = append(st.sbs, sb)
		start = time.Now()
		if err := r.m.Suspend(ctx, sb.Name); err != nil {
			return rep, fmt.Errorf("density (suspended): sandbox %d of %d: %w", i, m, err)
		}
		st.suspend = append(st.suspend, ms(time.Since(start)))
		if !slices.Contains(points, i) {
			continue
		}
		r.logf("density (suspended): %d of %d sandboxes", i, m)
		p, err := r.densityPoint(ctx, st, true)
		if err != nil {
			return rep, err
		}
		rep.Points = append(rep.Points, p)
	}
	r.logf("density (suspended): resume, call and remove each of the %d sandboxes", m)
	var rm []float64
	rep.Checked, rep.NotAnswering, rep.FirstFailure, rm = r.checkResumeRemove(ctx, st)
	rep.RemoveMS = summarize(rm)
	return rep, ctx.Err()
}

// createAlone times the create of a sandbox of spec into st.creates, and
// (suspend) its suspend into st.suspend, then removes it, untimed.
func (r *runner) createAlone(ctx context.Context, st *densityState, spec sandbox.Spec, suspend bool) (err error) {
	start := time.Now()
	sb, err := r.m.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("density: a sandbox alone: %w", err)
	}
	defer func() { err = errors.Join(err, r.m.Remove(context.WithoutCancel(ctx), sb.Name)) }()
	st.creates = append(st.creates, ms(time.Since(start)))
	if suspend {
		start = time.Now()
		if err := r.m.Suspend(ctx, sb.Name); err != nil {
			return fmt.Errorf("density: a sandbox alone: %w", err)
		}
		st.suspend = append(st.suspend, ms(time.Since(start)))
	}
	return nil
}

// densityPoint measures a series with st.sbs made (suspended: and
// suspended), in an order that keeps each figure from disturbing the next:
// after Idle, the processes and memory, then idle CPU, listing, and calls
// last.
func (r *runner) densityPoint(ctx context.Context, st *densityState, suspended bool) (DensityPoint, error) {
	p := DensityPoint{Sandboxes: len(st.sbs), CreateMS: summarize(st.creates)}
	st.creates = nil
	if suspended {
		s := summarize(st.suspend)
		p.SuspendMS, st.suspend = &s, nil
	}
	if err := sleepCtx(ctx, r.opts.Idle); err != nil {
		return p, err
	}
	ids := map[string]bool{}
	for _, sb := range st.sbs {
		ids[sb.ID] = true
	}
	byID, err := procmem.Containers(ids)
	if err != nil {
		return p, err
	}
	var all []int
	var pss []float64
	var charged int64 // by the sandboxes' memory cgroups
	var tot procmem.Usage
	for _, sb := range st.sbs {
		pids := byID[sb.ID]
		all = append(all, pids...)
		if m, err := sb.HostMemory(); err == nil {
			charged += m.Charged
		}
		u := procmem.Use(pids)
		if !suspended {
			pss = append(pss, float64(u.PSS))
		}
		tot.PSS += u.PSS
		tot.Processes += u.Processes
		tot.Tasks += u.Tasks
		tot.FDs += u.FDs
	}
	avail, err := memAvailable()
	if err != nil {
		return p, err
	}
	count := float64(len(st.sbs))
	p.MemAvailableDropKiB = st.memKiB - avail
	p.MemPerSandboxKiB = p.MemAvailableDropKiB / int64(len(st.sbs))
	p.PSSPerSandboxKiB = tot.PSS / int64(len(st.sbs))
	p.PSSKiB = summarize(pss)
	p.CgroupPerSandboxKiB = (charged >> 10) / int64(len(st.sbs))
	p.ProcessesPerSandbox, p.TasksPerSandbox, p.FDsPerSandbox = float64(tot.Processes)/count, float64(tot.Tasks)/count, float64(tot.FDs)/count

	if p.HostCPUPercent, p.SandboxCPUPercent, err = idleCPU(ctx, all); err != nil {
		return p, err
	}
	if p.ListMS, p.CLIListMS, err = r.timeLists(ctx, st); err != nil {
		return p, err
	}
	if suspended {
		if err := r.suspendedFigures(ctx, st, &p); err != nil {
			return p, err
		}
		return p, nil
	}
	if err := r.callFigures(ctx, st, &p); err != nil {
		return p, err
	}
	return p, nil
}

// timeLists times Manager.List and whole `flmbox sandbox ls --json`
// processes, each of which must list every sandbox of st.
func (r *runner) timeLists(ctx context.Context, st *densityState) (list, cli Stats, err error) {
	want := map[string]bool{}
	for _, sb := range st.sbs {
		want[sb.Name] = true
	}
	count := func(names []string) int {
		n := 0
		for _, name := range names {
			if want[name] {
				n++
			}
		}
		return n
	}
	var lx, cx []float64
	for i := range max(densityLists, densityCLILists) {
		if i < densityLists {
			start := time.Now()
			sbs, err := r.m.List(ctx)
			d := time.Since(start)
			if err != nil {
				return list, cli, err
			}
			var names []string
			for _, sb := range sbs {
				names = append(names, sb.Name)
			}
			if got := count(names); got != len(want) {
				return list, cli, fmt.Errorf("density: Manager.List gave %d of the bench's %d sandboxes", got, len(want))
			}
			lx = append(lx, ms(d))
		}
		if i < densityCLILists {
			d, out, err := timeCommand(r.flmbox(ctx, "sandbox", "ls", "--json"))
			if err != nil {
				return list, cli, err
			}
			names, err := lsNames(out)
			if err != nil {
				return list, cli, err
			}
			if got := count(names); got != len(want) {
				return list, cli, fmt.Errorf("density: flmbox sandbox ls --json gave %d of the bench's %d sandboxes", got, len(want))
			}
			cx = append(cx, ms(d))
		}
	}
	return summarize(lx), summarize(cx), nil
}

// lsNames returns the names `flmbox sandbox ls --json` printed.
func lsNames(out []byte) ([]string, error) {
	var sbs []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(out, &sbs); err != nil {
		return nil, fmt.Errorf("parse the output of flmbox sandbox ls --json: %w", err)
	}
	names := make([]string, len(sbs))
	for i, sb := range sbs {
		names[i] = sb.Name
	}
	return names, nil
}

// pick returns k of sbs at random (all of them, shuffled, if there are
// fewer).
func pick(sbs []*sandbox.Sandbox, k int) []*sandbox.Sandbox {
	idx := rand.Perm(len(sbs))
	out := make([]*sandbox.Sandbox, 0, min(k, len(sbs)))
	for _, i := range idx[:min(k, len(idx))] {
		out = append(out, sbs[i])
	}
	return out
}

// pickN returns k of sbs at random: distinct ones if there are as many,
// else some more than once.
func pickN(sbs []*sandbox.Sandbox, k int) []*sandbox.Sandbox {
	if len(sbs) >= k {
		return pick(sbs, k)
	}
	out := make([]*sandbox.Sandbox, k)
	for i := range out {
		out[i] = sbs[rand.IntN(len(sbs))]
	}
	return out
}

// callFigures calls a few random sandboxes of st: the first call of each
// since the point before (its spares may not be ready: lazy ones start
// theirs), then densityCalls warm calls in process and densityCLICalls
// whole `flmbox run --sandbox` processes, round robin over them.
func (r *runner) callFigures(ctx context.Context, st *densityState, p *DensityPoint) error {
	callees := pick(st.sbs, densityCallees)
	var first, warm, cli []float64
	for _, sb := range callees {
		d, err := r.call(ctx, sb.Name, shellSnippet)
		if err != nil {
			return fmt.Errorf("density: call sandbox %s: %w", sb.Name, err)
		}
		first = append(first, ms(d))
	}
	for i := range max(densityCalls, densityCLICalls) {
		sb := callees[i%len(callees)]
		if i < densityCalls {
			d, err := r.call(ctx, sb.Name, shellSnippet)
			if err != nil {
				return fmt.Errorf("density: call sandbox %s: %w", sb.Name, err)
			}
			warm = append(warm, ms(d))
		}
		if i < densityCLICalls {
			d, err := checkedCommand(r.flmbox(ctx, "run", "--sandbox", sb.Name, "--language", "shell", "-c", shellSnippet.code))
			if err != nil {
				return err
			}
			cli = append(cli, ms(d))
		}
	}
	f, w, c := summarize(first), summarize(warm), summarize(cli)
	p.FirstCallMS, p.CallMS, p.CLICallMS = &f, &w, &c
	return nil
}

// suspendedFigures measures the disk st's suspended sandboxes take and the
// resume of random ones: Manager.Resume + Call in process and whole
// `flmbox run --sandbox` processes, alternately, each sandbox suspended
// again after (not timed).
func (r *runner) suspendedFigures(ctx context.Context, st *densityState, p *DensityPoint) error {
	var disk int64
	var imgs []float64
	for _, sb := range st.sbs {
		disk += du(sb.Bundle)
	}
	sbs, err := r.m.List(ctx)
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if sb.State == sandbox.StateSuspended && strings.HasPrefix(sb.Name, "bench-density-suspended-") {
			imgs = append(imgs, float64(sb.ImageBytes))
		}
	}
	p.DiskPerSandboxBytes = disk / int64(len(st.sbs))
	p.ImageBytes = int64(summarize(imgs).Median)
	var inproc, cli []float64
	for i, sb := range pickN(st.sbs, 2*densityResumes) {
		start := time.Now()
		if i%2 == 0 {
			if _, err := r.m.Resume(ctx, sb.Name); err != nil {
				return fmt.Errorf("density: resume sandbox %s: %w", sb.Name, err)
			}
			if _, err := r.call(ctx, sb.Name, shellSnippet); err != nil {
				return fmt.Errorf("density: call resumed sandbox %s: %w", sb.Name, err)
			}
			inproc = append(inproc, ms(time.Since(start)))
		} else {
			d, err := timeToOutput(r.flmbox(ctx, "run", "--sandbox", sb.Name, "--language", "shell", "-c", shellSnippet.code), wantOutput)
			if err != nil {
				return err
			}
			cli = append(cli, ms(d))
		}
		if err := r.m.Suspend(ctx, sb.Name); err != nil {
			return fmt.Errorf("density: suspend sandbox %s again: %w", sb.Name, err)
		}
	}
	a, b := summarize(inproc), summarize(cli)
	p.ResumeMS, p.CLIResumeMS = &a, &b
	return nil
}

// checkAnswering calls each of sbs (densityCheckCalls at once) and counts
// those that did not answer.
func (r *runner) checkAnswering(ctx context.Context, sbs []*sandbox.Sandbox) (checked, failed int, first string) {
	var mu sync.Mutex
	each(ctx, len(sbs), densityCheckCalls, func(i int) {
		_, err := r.call(ctx, sbs[i].Name, shellSnippet)
		mu.Lock()
		defer mu.Unlock()
		checked++
		if err != nil {
			failed++
			if first == "" {
				first = fmt.Sprintf("%s: %v", sbs[i].Name, err)
			}
		}
	})
	return checked, failed, first
}

// checkResumeRemove resumes, calls and removes each sandbox of st (two at a
// time: a resumed sandbox holds memory until it is removed), counting those
// that did not answer; it returns the removals' times. st.sbs keeps those
// it could not remove.
func (r *runner) checkResumeRemove(ctx context.Context, st *densityState) (checked, failed int, first string, rm []float64) {
	var mu sync.Mutex
	removed := make([]bool, len(st.sbs))
	each(ctx, len(st.sbs), 2, func(i int) {
		sb := st.sbs[i]
		_, err := r.m.Resume(ctx, sb.Name)
		if err == nil {
			_, err = r.call(ctx, sb.Name, shellSnippet)
		}
		start := time.Now()
		rerr := r.m.Remove(context.WithoutCancel(ctx), sb.Name)
		d := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		checked++
		if err != nil {
			failed++
			if first == "" {
				first = fmt.Sprintf("%s: %v", sb.Name, err)
			}
		}
		if rerr == nil {
			removed[i] = true
			rm = append(rm, ms(d))
		}
	})
	var keep []*sandbox.Sandbox
	for i, sb := range st.sbs {
		if !removed[i] {
			keep = append(keep, sb)
		}
	}
	st.sbs = keep
	return checked, failed, first, rm
}

// each runs f(0) … f(n-1), at most par at once, until ctx is done.
func each(ctx context.Context, n, par int, f func(i int)) {
	workers.Run(ctx, n, par, func(next <-chan int) {
		for i := range next {
			f(i)
		}
	})
}

// removeAll removes every sandbox of st, timing each; it returns the
// times and what failed.
func (r *runner) removeAll(ctx context.Context, st *densityState) ([]float64, error) {
	if st == nil || len(st.sbs) == 0 {
		return nil, nil
	}
	r.logf("density (%s): remove %d sandboxes", st.name, len(st.sbs))
	var rm []float64
	var errs []error
	for _, sb := range st.sbs {
		start := time.Now()
		if err := r.m.Remove(ctx, sb.Name); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		rm = append(rm, ms(time.Since(start)))
	}
	st.sbs = nil
	return rm, errors.Join(errs...)
}
