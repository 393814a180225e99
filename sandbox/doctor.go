package sandbox

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/docker/go-units"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/egress"
)

// MinFreeBytes is the free space under a state root below which Doctor's
// space check fails: room for a few unpacked Python images.
const MinFreeBytes = 2 << 30

// Check is one of Doctor's findings.
type Check struct {
	// Name says what was checked: CheckRunsc, CheckPlatforms, ...
	Name CheckName `json:"name"`
	// OK says that this host passes the check; Detail what was found.
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Platforms are gVisor's platforms, each said supported by this host
	// or not (CheckPlatforms'); DefaultPlatform is runsc's, if runsc
	// answered.
	Platforms       []Platform `json:"platforms,omitempty"`
	DefaultPlatform string     `json:"-"`
	// Warn says that the host passes the check, but that something it
	// found limits flmbox (CheckLimits: a limit caps how many sandboxes
	// run at once below what the host's memory holds).
	Warn bool `json:"warn,omitempty"`
	// Limits are the host's limits on how many sandboxes run at once
	// (CheckLimits').
	Limits []HostLimit `json:"limits,omitempty"`
}

// CheckName names what a Check checked.
type CheckName string

// Doctor's checks, by Check.Name.
const (
	CheckRunsc     CheckName = "runsc"     // a runsc that answers
	CheckPlatforms CheckName = "platforms" // runsc's default platform runs here
	CheckAgent     CheckName = "agent"     // the agent binary is there
	CheckRoot      CheckName = "root"      // running as root
	CheckKernel    CheckName = "kernel"    // openat2(RESOLVE_IN_ROOT), for unpacking
	CheckCgroups   CheckName = "cgroups"   // the memory, pids and cpu controllers
	CheckSpace     CheckName = "space"     // MinFreeBytes free under the state root
	CheckEgress    CheckName = "egress"    // egress networks can be made (NetworkEgress)
	CheckLimits    CheckName = "limits"    // no host limit caps the count of sandboxes below what memory holds (a warning)
)

// Doctor checks that this host can run the Manager's sandboxes, and says
// what it found, one Check per thing checked, in the order of the Check*
// constants. It changes nothing.
func (m *Manager) Doctor(ctx context.Context) []Check {
	runsc, info := m.checkRunsc(ctx)
	return []Check{runsc, checkPlatforms(info), m.checkAgent(), checkRoot(), checkKernel(), checkCgroups(), checkSpace(m.root), m.checkEgress(),
		checkHostLimits(readHostFacts())}
}

// checkEgress checks what egress sandboxes need: their resolver binary,
// nftables, addresses no route of the host's takes, forwarding no other
// table drops.
func (m *Manager) checkEgress() Check {
	if _, err := m.Resolver(); err != nil {
		return Check{Name: CheckEgress, Detail: err.Error()}
	}
	detail, err := egress.Check()
	if err != nil {
		return Check{Name: CheckEgress, Detail: err.Error()}
	}
	return Check{Name: CheckEgress, OK: true, Detail: detail}
}

func (m *Manager) checkRunsc(ctx context.Context) (Check, *Runsc) {
	info, err := m.Runsc(ctx)
	if err != nil {
		return Check{Name: CheckRunsc, Detail: err.Error()}, nil
	}
	return Check{Name: CheckRunsc, OK: true, Detail: fmt.Sprintf("%s (version %s, default platform %s)", info.Path, info.Version, info.DefaultPlatform)}, info
}

// checkPlatforms says which gVisor platforms this host runs, and why not
// the others. It fails only if runsc's default platform (info's, if runsc
// answered) is not among them: the others are chosen with Spec.Platform.
func checkPlatforms(info *Runsc) Check {
	var can, cannot []string
	def := ""
	if info != nil {
		def = info.DefaultPlatform
	}
	ok := true
	platforms := Platforms()
	for _, p := range platforms {
		if p.Supported {
			can = append(can, p.Name)
			continue
		}
		cannot = append(cannot, fmt.Sprintf("not %s: %s", p.Name, p.Reason))
		if p.Name == def {
			ok = false
		}
	}
	detail := "this host runs " + strings.Join(can, ", ")
	if len(cannot) > 0 {
		detail += "; " + strings.Join(cannot, "; ")
	}
	return Check{Name: CheckPlatforms, OK: ok, Detail: detail, Platforms: platforms, DefaultPlatform: def}
}

func (m *Manager) checkAgent() Check {
	p, err := m.Agent()
	if err != nil {
		return Check{Name: CheckAgent, Detail: err.Error()}
	}
	return Check{Name: CheckAgent, OK: true, Detail: p + " (mounted into every sandbox as its first process)"}
}

func checkRoot() Check {
	if os.Geteuid() == 0 {
		return Check{Name: CheckRoot, OK: true, Detail: "running as root"}
	}
	return Check{Name: CheckRoot, Detail: fmt.Sprintf("running as uid %d", os.Geteuid())}
}

func checkKernel() Check {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how)
	if err != nil {
		return Check{Name: CheckKernel, Detail: "openat2(RESOLVE_IN_ROOT) is not available: " + err.Error()}
	}
	unix.Close(fd)
	var u unix.Utsname
	_ = unix.Uname(&u)
	return Check{Name: CheckKernel, OK: true, Detail: "Linux " + unix.ByteSliceToString(u.Release[:]) + ", openat2 available"}
}

func checkCgroups() Check {
	version, have := "v2", []string(nil)
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		have = strings.Fields(string(b))
	} else {
		version = "v1"
		for _, name := range []string{"memory", "pids", "cpu"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", name)); err == nil {
				have = append(have, name)
			}
		}
	}
	var missing []string
	for _, need := range []string{"memory", "pids", "cpu"} {
		if !slices.Contains(have, need) {
			missing = append(missing, need)
		}
	}
	if len(missing) > 0 {
		return Check{Name: CheckCgroups, Detail: fmt.Sprintf("cgroup %s lacks %s", version, strings.Join(missing, ", "))}
	}
	return Check{Name: CheckCgroups, OK: true, Detail: fmt.Sprintf("cgroup %s with memory, pids, cpu", version)}
}

func checkSpace(root string) Check {
	dir := root
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Check{Name: CheckSpace, Detail: fmt.Sprintf("statfs %s: %v", dir, err)}
	}
	free := int64(st.Bavail) * st.Bsize
	detail := fmt.Sprintf("%s free under %s", units.BytesSize(float64(free)), root)
	return Check{Name: CheckSpace, OK: free >= MinFreeBytes, Detail: detail}
}

// What one idle sandbox takes of the host's limits, measured on idle
// sandboxes of the default spec (systrap) on a 2-CPU Debian VM (Linux
// 6.18), after a Python and a shell call. Host inotify is not among them:
// runsc's gofer, sentry and stub processes hold no inotify instance
// (gVisor's inotify is the sentry's own), nor does flmbox, so fs.inotify.*
// caps nothing. vm.max_map_count is per process (an idle sentry maps 60 to
// 85 areas): it caps no count either.
const (
	// idleSandboxTasks are an idle sandbox's host tasks, each of which
	// takes a pid (kernel.pid_max) and a task (kernel.threads-max): its
	// pids cgroup held 39 to 41 after calls (runsc-gofer's 9 threads,
	// runsc-sandbox's 18 and a systrap stub task for each process in the
	// sandbox); 35 new, 31 new with --lazy-spares, 56 once resumed (a
	// restored sentry runs 40 threads).
	idleSandboxTasks = 40
	// idleSandboxFiles are an idle sandbox's open files (fs.file-max):
	// runsc-gofer's 40 and runsc-sandbox's 231 after calls (131 new, 58
	// new with --lazy-spares, 80 resumed); the stubs share the sentry's
	// descriptor table.
	idleSandboxFiles = 270
	// sandboxProcessFiles are the descriptors of an idle sandbox's largest
	// process, the sentry; each host file its sandbox opens adds one
	// (up to 1024 per process in the sandbox). runsc's processes inherit
	// flmbox's RLIMIT_NOFILE and raise their soft limit to the hard one.
	sandboxProcessFiles = 231
	// minNofile is the hard RLIMIT_NOFILE below which a sentry may run
	// out of descriptors for what its sandbox opens.
	minNofile = 4096
	// wantNofile is the hard RLIMIT_NOFILE to ask for: fs.nr_open's
	// default, the most a process may get without changing it.
	wantNofile = 1 << 20
	// idleSandboxMemory is the host memory of an idle sandbox:
	// MemAvailable fell 23.6 MiB per sandbox over 100 made one after
	// another (15 MiB with --lazy-spares, lazySandboxMemory, the least a
	// sandbox costs).
	idleSandboxMemory = 24 << 20
	lazySandboxMemory = 15 << 20
	// minSandboxesMemory is how many more idle sandboxes MemAvailable must
	// hold for memory not to be low.
	minSandboxesMemory = 16
	// maxMemcgs is how many memory cgroups the kernel holds at once
	// (MEM_CGROUP_ID_MAX), dying ones included.
	maxMemcgs = 65535
	// maxPidMax is kernel.pid_max's largest value on 64-bit Linux (and
	// systemd's default): a larger pid space costs nothing until used.
	maxPidMax = 1 << 22
)

// LimitName names a HostLimit: a sysctl, a resource limit of the process,
// or memory.
type LimitName string

// HostLimit names.
const (
	LimitPidMax     LimitName = "kernel.pid_max"
	LimitThreadsMax LimitName = "kernel.threads-max"
	LimitFileMax    LimitName = "fs.file-max"
	LimitNofile     LimitName = "RLIMIT_NOFILE"
	LimitMemory     LimitName = "MemAvailable"
	LimitMemcgs     LimitName = "memory cgroups"
)

// HostLimit is a limit of the host on how many sandboxes run at once, as
// Doctor found it (CheckLimits).
type HostLimit struct {
	// Name is the limit: LimitPidMax, LimitThreadsMax, LimitFileMax,
	// LimitNofile (this process's hard limit, which runsc's processes
	// inherit), LimitMemory or LimitMemcgs (the kernel's 65535 memory
	// cgroup IDs: each sandbox has one, and a removed sandbox's keeps its
	// ID while page cache it charged stays; /proc/cgroups counts them).
	Name LimitName `json:"name"`
	// Value is the limit and Used what the host uses of it now, in its
	// unit: tasks (pid_max, threads-max), open files, descriptors of one
	// process (RLIMIT_NOFILE: Used is an idle sandbox's sentry's), bytes
	// (MemAvailable: Value is MemTotal, Used what is not available).
	Value int64 `json:"value"`
	Used  int64 `json:"used"`
	// PerSandbox is what one idle sandbox takes of it.
	PerSandbox int64 `json:"per_sandbox"`
	// Sandboxes is how many more idle sandboxes it allows, roughly:
	// (Value-Used)/PerSandbox, or -1 for RLIMIT_NOFILE, which bounds what
	// each sandbox opens, not how many run.
	Sandboxes int64 `json:"sandboxes"`
	// Low says that the limit caps the count below what the host's memory
	// could hold (MemTotal over an idle --lazy-spares sandbox's memory):
	// it, not memory, decides how many sandboxes run. RLIMIT_NOFILE is low
	// below 4096, MemAvailable when it holds fewer than 16 more.
	Low bool `json:"low"`
	// Want is a value at which the limit is no longer low (0: none).
	Want int64 `json:"want,omitempty"`
}

// hostFacts are what checkLimits judges: 0 where unknown.
type hostFacts struct {
	pidMax, threadsMax, tasks int64 // tasks: threads alive on the host
	fileMax, files            int64 // files: open on the host
	nofile                    int64 // this process's hard RLIMIT_NOFILE
	memTotal, memAvailable    int64 // bytes
	memcgs                    int64 // memory cgroups, dying ones too (0: unknown)
}

// readHostFacts reads the host's limits and use from /proc.
func readHostFacts() hostFacts {
	var f hostFacts
	f.pidMax = readInt("/proc/sys/kernel/pid_max", 0)
	f.threadsMax = readInt("/proc/sys/kernel/threads-max", 0)
	f.fileMax = readInt("/proc/sys/fs/file-max", 0)
	f.files = readInt("/proc/sys/fs/file-nr", 0)
	// The fourth field of /proc/loadavg is running/total tasks.
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if fields := strings.Fields(string(b)); len(fields) >= 4 {
			if _, total, ok := strings.Cut(fields[3], "/"); ok {
				f.tasks, _ = strconv.ParseInt(total, 10, 64)
			}
		}
	}
	if b, err := os.ReadFile("/proc/cgroups"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if fields := strings.Fields(line); len(fields) >= 4 && fields[0] == "memory" {
				f.memcgs, _ = strconv.ParseInt(fields[2], 10, 64)
			}
		}
	}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		f.nofile = int64(min(rl.Max, math.MaxInt64))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			switch k {
			case "MemTotal":
				f.memTotal = kib << 10
			case "MemAvailable":
				f.memAvailable = kib << 10
			}
		}
	}
	return f
}

// readInt reads the field-th number of file path, 0 if it cannot.
func readInt(path string, field int) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if field >= len(fields) {
		return 0
	}
	n, _ := strconv.ParseInt(fields[field], 10, 64)
	return n
}

// HostLimits reads this host's limits on how many sandboxes run at once
// (/proc, this process's RLIMIT_NOFILE), and judges each as HostLimit
// says; those it cannot read are left out. Doctor's "limits" check says
// the same in words.
func HostLimits() []HostLimit { return hostLimits(readHostFacts()) }

// checkHostLimits says how many more idle sandboxes the host holds and which
// limit decides it, warning when a limit other than memory caps the count
// below what the host's memory could hold.
func checkHostLimits(f hostFacts) Check {
	limits := hostLimits(f)
	ch := Check{Name: CheckLimits, OK: true, Limits: limits}
	var bound *HostLimit
	var mem int64 = -1
	for i, l := range limits {
		if l.Low {
			ch.Warn = true
		}
		if l.Name == LimitMemory {
			mem = l.Sandboxes
		}
		if l.Sandboxes >= 0 && (bound == nil || l.Sandboxes < bound.Sandboxes) {
			bound = &limits[i]
		}
	}
	switch {
	case bound == nil:
		ch.Detail = "the host's limits are unknown (/proc unreadable)"
	case bound.Name == LimitMemory:
		ch.Detail = fmt.Sprintf("room for about %d more idle sandboxes, bound by memory (%s each)", bound.Sandboxes, units.BytesSize(idleSandboxMemory))
	case mem >= 0:
		ch.Detail = fmt.Sprintf("room for about %d more idle sandboxes, bound by %s (memory holds about %d)", bound.Sandboxes, bound.Name, mem)
	default:
		ch.Detail = fmt.Sprintf("room for about %d more idle sandboxes, bound by %s", bound.Sandboxes, bound.Name)
	}
	return ch
}

// hostLimits judges the host's limits on the count of sandboxes, as
// HostLimit says; the unknown ones are left out.
func hostLimits(f hostFacts) []HostLimit {
	// The most idle sandboxes the host's memory could hold.
	memCap := f.memTotal / lazySandboxMemory
	var out []HostLimit
	count := func(name LimitName, value, used, per, want int64) {
		if value <= 0 {
			return
		}
		l := HostLimit{Name: name, Value: value, Used: used, PerSandbox: per, Sandboxes: max(0, (value-used)/per)}
		if memCap > 0 && value/per < memCap {
			l.Low, l.Want = true, max(want, value)
		}
		out = append(out, l)
	}
	count(LimitPidMax, f.pidMax, f.tasks, idleSandboxTasks, maxPidMax)
	count(LimitThreadsMax, f.threadsMax, f.tasks, idleSandboxTasks, roundPow2(memCap*idleSandboxTasks+f.tasks))
	count(LimitFileMax, f.fileMax, f.files, idleSandboxFiles, roundPow2(memCap*idleSandboxFiles+f.files))
	if f.memcgs > 0 {
		count(LimitMemcgs, maxMemcgs, f.memcgs, 1, 0)
	}
	if f.nofile > 0 {
		l := HostLimit{Name: LimitNofile, Value: f.nofile, Used: sandboxProcessFiles, PerSandbox: sandboxProcessFiles, Sandboxes: -1}
		if f.nofile < minNofile {
			l.Low, l.Want = true, wantNofile
		}
		out = append(out, l)
	}
	if f.memTotal > 0 {
		l := HostLimit{Name: LimitMemory, Value: f.memTotal, Used: f.memTotal - f.memAvailable, PerSandbox: idleSandboxMemory,
			Sandboxes: f.memAvailable / idleSandboxMemory}
		l.Low = l.Sandboxes < minSandboxesMemory
		out = append(out, l)
	}
	return out
}

// roundPow2 is the least power of two at least n.
func roundPow2(n int64) int64 {
	p := int64(1)
	for p < n {
		p <<= 1
	}
	return p
}
