package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/snippet/wire"
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
	mem, err := idleMemory(ctx, r.rawBundle(), r.opts.Idle)
	if err != nil {
		return rep, err
	}
	rep.BareRunscKiB, rep.BareRunscRSSKiB, rep.BareRunscProcesses = mem.pss, mem.rss, mem.processes
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
		if rerr := r.m.Remove(context.WithoutCancel(ctx), sb.Name); err == nil {
			err = rerr
		}
	}()
	mem, err := idleMemory(ctx, sb.Bundle, r.opts.Idle)
	if err != nil {
		return m, err
	}
	m.KiB, m.RSSKiB, m.Processes = mem.pss, mem.rss, mem.processes
	first := map[string]*float64{wire.LanguagePython: &m.FirstPythonMS, wire.LanguageShell: &m.FirstShellMS}
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
	m.WarmPythonMS, m.WarmShellMS = summarize(warm[wire.LanguagePython]), summarize(warm[wire.LanguageShell])
	if mem, err = idleMemory(ctx, sb.Bundle, r.opts.Idle); err != nil {
		return m, err
	}
	m.UsedKiB, m.UsedRSSKiB, m.UsedProcesses = mem.pss, mem.rss, mem.processes
	return m, nil
}

// hostMemory is the memory of a set of host processes, in KiB.
type hostMemory struct {
	rss, pss  int64
	processes int
}

// idleMemory waits for idle, then measures the runsc container of bundle.
func idleMemory(ctx context.Context, bundle string, idle time.Duration) (hostMemory, error) {
	select {
	case <-ctx.Done():
		return hostMemory{}, ctx.Err()
	case <-time.After(idle):
	}
	pids, err := bundleProcesses(bundle)
	if err != nil {
		return hostMemory{}, err
	}
	return processMemory(pids)
}

// bundleProcesses returns every host process of the runsc container of
// bundle: those whose command line names the bundle (runsc's sandbox and
// gofer processes: --bundle=DIR or --bundle DIR) and all their descendants
// (systrap's stub processes).
func bundleProcesses(bundle string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentPID(pid); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
		if cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && namesBundle(cmd, bundle) {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("measure memory: no host process of the container of %s", bundle)
	}
	// A process can both name the bundle and descend from one that does
	// (gVisor's stub processes are forks of the sandbox process): count it
	// once.
	seen := map[int]bool{}
	for _, pid := range pids {
		seen[pid] = true
	}
	for i := 0; i < len(pids); i++ {
		for _, c := range children[pids[i]] {
			if !seen[c] {
				pids = append(pids, c)
				seen[c] = true
			}
		}
	}
	return pids, nil
}

// namesBundle reports whether a NUL-separated command line has
// --bundle=DIR or --bundle DIR (or -bundle).
func namesBundle(cmdline []byte, dir string) bool {
	args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	for i, a := range args {
		flag, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if flag != "bundle" || a == flag {
			continue
		}
		if hasValue && value == dir || !hasValue && i+1 < len(args) && args[i+1] == dir {
			return true
		}
	}
	return false
}

// parentPID reads the parent of pid from /proc/PID/stat.
func parentPID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which ends with the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[1])
}

// processMemory sums Rss and Pss of /proc/PID/smaps_rollup over pids.
func processMemory(pids []int) (hostMemory, error) {
	var m hostMemory
	for _, pid := range pids {
		f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue // exited meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[2] != "kB" {
				continue
			}
			n, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Rss:":
				m.rss += n
			case "Pss:":
				m.pss += n
			}
		}
		f.Close()
		m.processes++
	}
	if m.processes == 0 {
		return m, fmt.Errorf("measure memory: the container's processes are gone")
	}
	return m, nil
}
