package bench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/flmbox/flmbox/internal/errkind"
	"github.com/flmbox/flmbox/internal/procmem"
	"github.com/flmbox/flmbox/sandbox"
	"golang.org/x/sys/unix"
)

// What the density section reads of the host (/proc): its limits on the
// count of sandboxes, its memory and CPU, and the host processes of the
// bench's sandboxes.

// densityDiskPerSuspend is the disk a suspended sandbox takes, as the
// host-limit check assumes it (its checkpoint image is 1.6 to 5 MiB beside
// its bundle); densityReserve is host memory left to everyone else: the
// check refuses a count that would leave less, and the series stop (with
// an error) if MemAvailable falls below it.
const (
	densityDiskPerSuspend = 8 << 20
	densityReserveKiB     = 1 << 20
)

// ErrHostLimit is in the error of a density bench that the host's limits
// would stop before its count. It is errdefs.ErrResourceExhausted.
var ErrHostLimit = errkind.New(errdefs.ErrResourceExhausted, "host limit: resource exhausted")

// readLimits reads the host's limits on the count (sandbox.HostLimits) and
// the free disk of root.
func readLimits(root string) (DensityLimits, error) {
	l := DensityLimits{Limits: sandbox.HostLimits()}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return l, fmt.Errorf("read the free disk of %s: %w", root, err)
	}
	l.DiskFreeBytes = int64(st.Bavail) * st.Bsize
	l.MaxSandboxes, l.CappedBy = capacity(l.Limits)
	l.MaxSuspended = int(max(0, l.DiskFreeBytes/densityDiskPerSuspend))
	return l, nil
}

// capacity is the most running sandboxes limits allow, less what the bench
// leaves to everyone else, and which limit sets it, in words; -1 if none
// is known.
func capacity(limits []sandbox.HostLimit) (int, string) {
	n, why := int64(-1), "no known limit"
	for _, l := range limits {
		room := l.Sandboxes
		if room < 0 {
			continue // RLIMIT_NOFILE: what each sandbox opens
		}
		what := fmt.Sprintf("%s %d (%d in use, about %d a sandbox)", l.Name, l.Value, l.Used, l.PerSandbox)
		if l.Name == sandbox.LimitMemory {
			room = max(0, (l.Value-l.Used)-densityReserveKiB<<10) / l.PerSandbox
			what = fmt.Sprintf("free memory (%s available, about %d MiB a sandbox, 1 GiB kept free)", fmtGiB(l.Value-l.Used), l.PerSandbox>>20)
		}
		if n < 0 || room < n {
			n, why = room, what
		}
	}
	return int(n), why
}

// check refuses n running and m suspended sandboxes if the limits do not
// allow them (ErrHostLimit).
func (l DensityLimits) check(n, m int) error {
	if l.MaxSandboxes >= 0 && n > l.MaxSandboxes {
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
		return busy, total, procmem.Ticks(pids), err
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
		sandboxes = percent(float64(s1-s0)/procmem.UserHZ, elapsed*cpus)
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
