package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// What the density section reads of the host (/proc): its limits on the
// count of sandboxes, its memory and CPU, and the host processes of the
// bench's sandboxes.

// Per-sandbox costs that the host-limit check assumes (measured: an idle
// sandbox with default spares costs some 24 MiB of MemAvailable, 33 to 35
// host tasks (9 gofer and 16 to 19 sandbox threads, 4 to 5 systrap stubs;
// 32 with lazy spares), 40 + 131 descriptors; a suspended one's checkpoint
// image is 1.6 to 5 MiB beside its bundle).
const (
	densityKiBPerSandbox   = 25 << 10
	densityTasksPerSandbox = 35
	densityFilesPerSandbox = 200
	densityDiskPerSuspend  = 8 << 20
	// densityReserveKiB is host memory left to everyone else: the check
	// refuses a count that would leave less, and the series stop (with an
	// error) if MemAvailable falls below it.
	densityReserveKiB = 1 << 20
	// densityTaskReserve is tasks (and open files) left to everyone else.
	densityTaskReserve = 2000
)

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

// cgroupMemoryFile returns the file that holds the memory charged to the
// cgroup of a process, from its /proc/PID/cgroup text: cgroup v1's
// memory.usage_in_bytes of its memory controller's group, or, with no
// memory controller on v1, cgroup v2's memory.current ("" if neither).
func cgroupMemoryFile(cgroup string) string {
	var v2 string
	for _, line := range strings.Split(cgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if slices.Contains(strings.Split(f[1], ","), "memory") {
			return filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.usage_in_bytes")
		}
		if f[0] == "0" && f[1] == "" {
			v2 = filepath.Join("/sys/fs/cgroup", f[2], "memory.current")
		}
	}
	if v2 != "" {
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
			return v2
		}
	}
	return ""
}

// cgroupKiB sums the memory charged to the cgroups of the processes pids
// (a pid of each sandbox), each cgroup once, in KiB; a cgroup that is the
// host's root, or any of those of this process, counts for none (the
// sandboxes then have no cgroup of their own).
func cgroupKiB(proc string, pids []int) int64 {
	own := map[string]bool{"": true}
	if b, err := os.ReadFile(filepath.Join(proc, "self", "cgroup")); err == nil {
		own[cgroupMemoryFile(string(b))] = true
	}
	seen := map[string]bool{}
	var n int64
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
		if err != nil {
			continue
		}
		file := cgroupMemoryFile(string(b))
		if own[file] || seen[file] || filepath.Dir(file) == "/sys/fs/cgroup/memory" || filepath.Dir(file) == "/sys/fs/cgroup" {
			continue
		}
		seen[file] = true
		if b, err := os.ReadFile(file); err == nil {
			if x, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				n += x >> 10
			}
		}
	}
	return n
}
