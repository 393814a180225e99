package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/sandbox"
)

// The density section (issue 31) makes Options.Density idle sandboxes one
// after another, measuring at every tenth of them (and at the first) what
// each costs the host and what the count costs every sandbox: host memory
// (MemAvailable's drop, and the PSS of their processes), creates, listing,
// warm calls on random ones, idle CPU, host tasks and file descriptors. It
// does so with flmbox's default spares, then with lazy spares, then for
// Options.DensitySuspended sandboxes each suspended right after its create
// (disk, suspend, and the resume of a random one by its next call).

// Per-sandbox costs that the host-limit check assumes (measured: an idle
// sandbox with default spares costs some 24 MiB of MemAvailable, 9 gofer +
// 16 to 19 sandbox threads + 4 to 5 systrap stubs, 40 + 131 descriptors;
// a suspended one's checkpoint image is 1.6 to 5 MiB beside its bundle).
const (
	densityKiBPerSandbox   = 25 << 10
	densityTasksPerSandbox = 32
	densityFilesPerSandbox = 200
	densityDiskPerSuspend  = 8 << 20
	// densityReserveKiB is host memory left to everyone else: the check
	// refuses a count that would leave less, and the series stop (with an
	// error) if MemAvailable falls below it.
	densityReserveKiB = 1 << 20
	// densityTaskReserve is tasks (and open files) left to everyone else.
	densityTaskReserve = 2000
)

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

// Density is the density section: its series, default spares, lazy spares
// and suspended, in that order, and the host limits read before.
type Density struct {
	// Sandboxes is Options.Density (N), Suspended DensitySuspended (M).
	Sandboxes int             `json:"sandboxes"`
	Suspended int             `json:"suspended"`
	Limits    DensityLimits   `json:"limits"`
	Series    []DensitySeries `json:"series"`
}

// DensityLimits are the host's limits on the count, read before the bench
// made anything, and the counts they allow (at the per-sandbox costs the
// check assumes: 25 MiB, 32 tasks, 200 open files, 8 MiB of disk a
// suspended sandbox).
type DensityLimits struct {
	MemAvailableKiB int64 `json:"mem_available_kib"`
	PidMax          int64 `json:"pid_max"`
	ThreadsMax      int64 `json:"threads_max"`
	Tasks           int64 `json:"tasks"` // host tasks (threads) at the time
	FileMax         int64 `json:"file_max"`
	FilesOpen       int64 `json:"files_open"`
	NoFile          int64 `json:"nofile"` // this process's soft RLIMIT_NOFILE
	DiskFreeBytes   int64 `json:"disk_free_bytes"`
	// MaxSandboxes is the most running sandboxes the limits allow, and
	// CappedBy the limit that sets it; MaxSuspended the most suspended
	// ones the free disk allows.
	MaxSandboxes int    `json:"max_sandboxes"`
	CappedBy     string `json:"capped_by"`
	MaxSuspended int    `json:"max_suspended"`
}

// DensitySeries is one series: its points, in the order of their counts,
// the all-answering check at its end, and its removals.
type DensitySeries struct {
	// Name is "default", "lazy" (Spec.LazySpares) or "suspended".
	Name   string         `json:"name"`
	Points []DensityPoint `json:"points"`
	// Checked sandboxes were called at the end of the series (a suspended
	// one resumed first); NotAnswering of them failed, the first failure
	// in FirstFailure.
	Checked      int    `json:"checked"`
	NotAnswering int    `json:"not_answering"`
	FirstFailure string `json:"first_failure,omitempty"`
	// RemoveMS is Manager.Remove of each sandbox at the end (of the
	// suspended series: each resumed, called and removed).
	RemoveMS Stats `json:"remove_ms"`
}

// DensityPoint is what a series measured with Sandboxes of its sandboxes
// alive (suspended, in the suspended series). Stats of KiB are per
// sandbox, of the bench's sandboxes; host-wide figures include whatever
// else runs.
type DensityPoint struct {
	Sandboxes int `json:"sandboxes"`
	// MemAvailableDropKiB is how far /proc/meminfo's MemAvailable fell
	// since before the series' first sandbox; MemPerSandboxKiB that drop
	// divided by Sandboxes.
	MemAvailableDropKiB int64 `json:"mem_available_drop_kib"`
	MemPerSandboxKiB    int64 `json:"mem_per_sandbox_kib"`
	// PSSPerSandboxKiB is the PSS of all their host processes (runsc-gofer,
	// runsc-sandbox and its children, each address space once) divided by
	// Sandboxes; PSSKiB of each sandbox's.
	PSSPerSandboxKiB int64 `json:"pss_per_sandbox_kib"`
	PSSKiB           Stats `json:"pss_kib"`
	// Host processes, tasks (threads: each takes a pid) and open file
	// descriptors (each table once) of their processes, per sandbox.
	ProcessesPerSandbox float64 `json:"processes_per_sandbox"`
	TasksPerSandbox     float64 `json:"tasks_per_sandbox"`
	FDsPerSandbox       float64 `json:"fds_per_sandbox"`
	// CreateMS is Manager.Create of the sandboxes made since the previous
	// point; SuspendMS (suspended series) Manager.Suspend of each.
	CreateMS  Stats  `json:"create_ms"`
	SuspendMS *Stats `json:"suspend_ms,omitempty"`
	// ListMS is Manager.List in process; CLIListMS a whole `flmbox sandbox
	// ls --json`, as a user runs it.
	ListMS    Stats `json:"list_ms"`
	CLIListMS Stats `json:"cli_list_ms"`
	// FirstCallMS is the first call (Manager.Call, shell echo) of a few
	// random sandboxes since the point before; CallMS their next calls,
	// warm; CLICallMS whole `flmbox run --sandbox` processes on them.
	// Running series only.
	FirstCallMS *Stats `json:"first_call_ms,omitempty"`
	CallMS      *Stats `json:"call_ms,omitempty"`
	CLICallMS   *Stats `json:"cli_call_ms,omitempty"`
	// ResumeMS is Manager.Resume + Manager.Call of a random suspended
	// sandbox, CLIResumeMS a whole `flmbox run --sandbox` of one (which
	// resumes it) until its result; each suspended again after.
	// Suspended series only.
	ResumeMS    *Stats `json:"resume_ms,omitempty"`
	CLIResumeMS *Stats `json:"cli_resume_ms,omitempty"`
	// DiskPerSandboxBytes is the disk the sandboxes' directories take (du)
	// divided by Sandboxes, ImageBytes the median checkpoint image
	// (Sandbox.ImageBytes). Suspended series only.
	DiskPerSandboxBytes int64 `json:"disk_per_sandbox_bytes,omitempty"`
	ImageBytes          int64 `json:"image_bytes,omitempty"`
	// HostCPUPercent is the host's busy time over a few idle seconds, in %
	// of all its CPUs (/proc/stat); SandboxCPUPercent the part of the
	// bench's sandboxes' processes.
	HostCPUPercent    float64 `json:"host_cpu_percent"`
	SandboxCPUPercent float64 `json:"sandbox_cpu_percent"`
}

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

// ErrHostLimit is in the error of a density bench that the host's limits
// would stop before its count. It is errdefs.ErrResourceExhausted.
var ErrHostLimit = fmt.Errorf("host limit: %w", errdefs.ErrResourceExhausted)

// readLimits reads the host's limits on the count under proc (/proc) and
// the free disk of root.
func readLimits(proc, root string) (DensityLimits, error) {
	var l DensityLimits
	b, err := os.ReadFile(filepath.Join(proc, "meminfo"))
	if err != nil {
		return l, fmt.Errorf("read the host's free memory: %w", err)
	}
	if l.MemAvailableKiB, err = meminfoKiB(b, "MemAvailable"); err != nil {
		return l, err
	}
	for _, f := range []struct {
		path string
		dst  *int64
	}{{"sys/kernel/pid_max", &l.PidMax}, {"sys/kernel/threads-max", &l.ThreadsMax}} {
		b, err := os.ReadFile(filepath.Join(proc, f.path))
		if err != nil {
			return l, fmt.Errorf("read the host's limits: %w", err)
		}
		if *f.dst, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return l, fmt.Errorf("parse %s: %w", f.path, err)
		}
	}
	if b, err = os.ReadFile(filepath.Join(proc, "loadavg")); err != nil {
		return l, fmt.Errorf("read the host's task count: %w", err)
	}
	if l.Tasks, err = loadavgTasks(b); err != nil {
		return l, err
	}
	if b, err = os.ReadFile(filepath.Join(proc, "sys/fs/file-nr")); err != nil {
		return l, fmt.Errorf("read the host's open files: %w", err)
	}
	if l.FilesOpen, l.FileMax, err = fileNr(b); err != nil {
		return l, err
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		l.NoFile = int64(min(rl.Cur, 1<<62))
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return l, fmt.Errorf("read the free disk of %s: %w", root, err)
	}
	l.DiskFreeBytes = int64(st.Bavail) * st.Bsize
	l.MaxSandboxes, l.CappedBy = l.capacity()
	l.MaxSuspended = int(max(0, l.DiskFreeBytes/densityDiskPerSuspend))
	return l, nil
}

// capacity is the most running sandboxes l allows, and which limit sets
// it, in words.
func (l DensityLimits) capacity() (int, string) {
	type limit struct {
		n   int64
		why string
	}
	taskRoom := func(max int64) int64 { return (max - l.Tasks - densityTaskReserve) / densityTasksPerSandbox }
	ls := []limit{
		{(l.MemAvailableKiB - densityReserveKiB) / densityKiBPerSandbox,
			fmt.Sprintf("free memory (MemAvailable %s, about 25 MiB a sandbox, 1 GiB kept free)", fmtGiB(l.MemAvailableKiB<<10))},
		{taskRoom(l.PidMax), fmt.Sprintf("kernel.pid_max %d (%d tasks running, about %d a sandbox)", l.PidMax, l.Tasks, densityTasksPerSandbox)},
		{taskRoom(l.ThreadsMax), fmt.Sprintf("kernel.threads-max %d (%d tasks running, about %d a sandbox)", l.ThreadsMax, l.Tasks, densityTasksPerSandbox)},
		{(l.FileMax - l.FilesOpen - densityTaskReserve) / densityFilesPerSandbox,
			fmt.Sprintf("fs.file-max %d (%d open, about %d a sandbox)", l.FileMax, l.FilesOpen, densityFilesPerSandbox)},
	}
	best := ls[0]
	for _, x := range ls[1:] {
		if x.n < best.n {
			best = x
		}
	}
	return int(max(0, best.n)), best.why
}

// check refuses n running and m suspended sandboxes if the limits do not
// allow them (ErrHostLimit).
func (l DensityLimits) check(n, m int) error {
	if n > l.MaxSandboxes {
		return fmt.Errorf("density %d: %s allows at most %d sandboxes: %w", n, l.CappedBy, l.MaxSandboxes, ErrHostLimit)
	}
	if m > l.MaxSuspended {
		return fmt.Errorf("density: %d suspended sandboxes: the free disk (%s, about 8 MiB a suspended sandbox) allows at most %d: %w",
			m, fmtGiB(l.DiskFreeBytes), l.MaxSuspended, ErrHostLimit)
	}
	return nil
}

func fmtGiB(bytes int64) string { return fmt.Sprintf("%.1f GiB", float64(bytes)/(1<<30)) }

// meminfoKiB returns the value of key in /proc/meminfo's text, in KiB.
func meminfoKiB(meminfo []byte, key string) (int64, error) {
	for _, line := range strings.Split(string(meminfo), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == key+":" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", key)
}

// loadavgTasks returns the host's task count from /proc/loadavg's text
// ("0.1 0.2 0.3 RUNNING/TASKS LASTPID").
func loadavgTasks(b []byte) (int64, error) {
	f := strings.Fields(string(b))
	if len(f) >= 4 {
		if _, tasks, ok := strings.Cut(f[3], "/"); ok {
			return strconv.ParseInt(tasks, 10, 64)
		}
	}
	return 0, fmt.Errorf("parse /proc/loadavg %q", strings.TrimSpace(string(b)))
}

// fileNr parses /proc/sys/fs/file-nr: open files, (unused), file-max.
func fileNr(b []byte) (open, max int64, err error) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, 0, fmt.Errorf("parse /proc/sys/fs/file-nr %q", strings.TrimSpace(string(b)))
	}
	if open, err = strconv.ParseInt(f[0], 10, 64); err == nil {
		max, err = strconv.ParseInt(f[2], 10, 64)
	}
	return open, max, err
}

// cpuTimes parses /proc/stat's first line: the host's busy and total
// ticks (busy: all but idle and iowait; guest time is in user already).
func cpuTimes(stat []byte) (busy, total uint64, err error) {
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("parse /proc/stat: %q", line)
	}
	for i, s := range f[1:min(len(f), 9)] { // user … steal
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parse /proc/stat: %q", line)
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

// procStat parses /proc/PID/stat: the parent pid and the process's CPU
// ticks (utime + stime, all its threads).
func procStat(b []byte) (ppid int, ticks uint64, err error) {
	// The command name, in parentheses, may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/PID/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is the state (field 3); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("parse /proc/PID/stat")
	}
	if ppid, err = strconv.Atoi(f[1]); err != nil {
		return 0, 0, err
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, err
	}
	return ppid, u + s, nil
}

// rollupKiB parses /proc/PID/smaps_rollup: Rss and Pss in KiB.
func rollupKiB(b []byte) (rss, pss int64) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			rss += n
		case "Pss:":
			pss += n
		}
	}
	return rss, pss
}

// sandboxProcs finds the host processes of the runsc containers ids in one
// walk of proc: those whose command line ends with a container's ID
// (runsc's sandbox and gofer processes) and all their descendants (the
// stubs of systrap). It returns them by ID.
func sandboxProcs(proc string, ids map[string]bool) (map[string][]int, error) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	byID := map[string][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join(proc, e.Name())
		if b, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil {
			if ppid, _, err := procStat(b); err == nil {
				children[ppid] = append(children[ppid], pid)
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if id := args[len(args)-1]; ids[id] {
			byID[id] = append(byID[id], pid)
		}
	}
	for id, pids := range byID {
		seen := map[int]bool{}
		for _, p := range pids {
			seen[p] = true
		}
		// A matching process's child may match too (forked, not exec'd).
		for i := 0; i < len(pids); i++ {
			for _, c := range children[pids[i]] {
				if !seen[c] {
					seen[c] = true
					pids = append(pids, c)
				}
			}
		}
		byID[id] = pids
	}
	return byID, nil
}

// procUsage is what a sandbox's host processes use.
type procUsage struct {
	rss, pss       int64 // KiB, each address space once
	processes, fds int   // fds: each descriptor table once
	tasks          int
	ticks          uint64 // CPU, utime + stime
}

// kcmp(2)'s types: the same address space, the same descriptor table.
const (
	kcmpVM    = 1
	kcmpFiles = 2
)

// kcmpSame reports whether processes a and b share what typ names; where
// kcmp cannot tell (a process gone), they do not.
func kcmpSame(a, b, typ int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), uintptr(typ), 0, 0, 0)
	return errno == 0 && r == 0
}

// usageOf measures pids, one sandbox's host processes. Processes gone
// meanwhile are left out.
func usageOf(proc string, pids []int) procUsage {
	var u procUsage
	var vms, tables []int // a pid per address space, per descriptor table
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		b, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		_, ticks, err := procStat(b)
		if err != nil {
			continue
		}
		u.processes++
		u.ticks += ticks
		if ts, err := os.ReadDir(filepath.Join(dir, "task")); err == nil {
			u.tasks += len(ts)
		}
		if !slices.ContainsFunc(vms, func(o int) bool { return kcmpSame(pid, o, kcmpVM) }) {
			vms = append(vms, pid)
			if b, err := os.ReadFile(filepath.Join(dir, "smaps_rollup")); err == nil {
				rss, pss := rollupKiB(b)
				u.rss, u.pss = u.rss+rss, u.pss+pss
			}
		}
		if !slices.ContainsFunc(tables, func(o int) bool { return kcmpSame(pid, o, kcmpFiles) }) {
			tables = append(tables, pid)
			if fds, err := os.ReadDir(filepath.Join(dir, "fd")); err == nil {
				u.fds += len(fds)
			}
		}
	}
	return u
}

// cpuTicks sums the CPU ticks of pids (gone ones count 0).
func cpuTicks(proc string, pids []int) uint64 {
	var n uint64
	for _, pid := range pids {
		if b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat")); err == nil {
			if _, t, err := procStat(b); err == nil {
				n += t
			}
		}
	}
	return n
}

// userHZ is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// percent is part of whole in %, 0 if whole is 0.
func percent(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * part / whole
}

// density runs the density section: the limits are checked again (others
// may have used memory since Run began), then the three series.
func (r *runner) measureDensity(ctx context.Context) (*Density, error) {
	n, m := r.opts.Density, r.opts.densitySuspended()
	lim, err := readLimits("/proc", r.root)
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

// memAvailable reads MemAvailable (KiB).
func memAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return meminfoKiB(b, "MemAvailable")
}

// guardMemory fails if the host has less than the reserve left, so that
// a series stops before the machine runs short.
func guardMemory(made int) error {
	avail, err := memAvailable()
	if err != nil {
		return err
	}
	if avail < densityReserveKiB {
		return fmt.Errorf("density: stopped at %d sandboxes: MemAvailable is down to %s: %w", made, fmtGiB(avail<<10), ErrHostLimit)
	}
	return nil
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
	byID, err := sandboxProcs("/proc", ids)
	if err != nil {
		return p, err
	}
	var all []int
	var pss []float64
	var tot procUsage
	for _, sb := range st.sbs {
		pids := byID[sb.ID]
		all = append(all, pids...)
		u := usageOf("/proc", pids)
		if !suspended {
			pss = append(pss, float64(u.pss))
		}
		tot.pss += u.pss
		tot.processes += u.processes
		tot.tasks += u.tasks
		tot.fds += u.fds
	}
	avail, err := memAvailable()
	if err != nil {
		return p, err
	}
	count := float64(len(st.sbs))
	p.MemAvailableDropKiB = st.memKiB - avail
	p.MemPerSandboxKiB = p.MemAvailableDropKiB / int64(len(st.sbs))
	p.PSSPerSandboxKiB = tot.pss / int64(len(st.sbs))
	p.PSSKiB = summarize(pss)
	p.ProcessesPerSandbox, p.TasksPerSandbox, p.FDsPerSandbox = float64(tot.processes)/count, float64(tot.tasks)/count, float64(tot.fds)/count

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

// idleCPU measures the host's busy time over densityCPUWindow, and that of
// pids, in % of all the host's CPUs.
func idleCPU(ctx context.Context, pids []int) (host, sandboxes float64, err error) {
	read := func() (busy, total, ticks uint64, err error) {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, 0, 0, err
		}
		busy, total, err = cpuTimes(b)
		return busy, total, cpuTicks("/proc", pids), err
	}
	b0, t0, s0, err := read()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := sleepCtx(ctx, densityCPUWindow); err != nil {
		return 0, 0, err
	}
	b1, t1, s1, err := read()
	if err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(start).Seconds()
	cpus := float64(goruntime.NumCPU())
	host = percent(float64(b1-b0), float64(t1-t0))
	if s1 > s0 {
		sandboxes = percent(float64(s1-s0)/userHZ, elapsed*cpus)
	}
	return host, sandboxes, nil
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

// du is the disk that the files under dir take (allocated blocks).
func du(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*unix.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
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
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(par, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
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
