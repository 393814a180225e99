package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/sandbox"
)

func TestDensityPoints(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want []int
	}{
		{0, nil},
		{1, []int{1}},
		{5, []int{1, 2, 3, 4, 5}},
		{15, []int{1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15}},
		{50, []int{1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50}},
		{500, []int{1, 50, 100, 150, 200, 250, 300, 350, 400, 450, 500}},
	} {
		if got := densityPoints(tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("densityPoints(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestProcParsers(t *testing.T) {
	meminfo := []byte("MemTotal:       24683792 kB\nMemFree:         1000 kB\nMemAvailable:   23254576 kB\n")
	if got, err := meminfoKiB(meminfo, "MemAvailable"); err != nil || got != 23254576 {
		t.Errorf("MemAvailable: %d, %v", got, err)
	}
	if _, err := meminfoKiB(meminfo, "SwapTotal"); err == nil {
		t.Error("a missing key: no error")
	}
	if got, err := loadavgTasks([]byte("0.66 2.64 3.67 1/1823 18917\n")); err != nil || got != 1823 {
		t.Errorf("loadavg: %d, %v", got, err)
	}
	if _, err := loadavgTasks([]byte("0.66 2.64\n")); err == nil {
		t.Error("a short loadavg: no error")
	}
	if open, max, err := fileNr([]byte("3730\t0\t2466290\n")); err != nil || open != 3730 || max != 2466290 {
		t.Errorf("file-nr: %d %d %v", open, max, err)
	}
	// user nice system idle iowait irq softirq steal guest guest_nice
	busy, total, err := cpuTimes([]byte("cpu  100 5 50 1000 20 3 2 0 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"))
	if err != nil || busy != 160 || total != 1180 {
		t.Errorf("cpu: busy %d total %d %v; want 160 and 1180", busy, total, err)
	}
	if _, _, err := cpuTimes([]byte("intr 1 2 3\n")); err == nil {
		t.Error("no cpu line: no error")
	}
	// A command name with spaces and a parenthesis.
	stat := "16937 (runsc (sandbox) x) S 1 16937 16937 0 -1 4194560 1 0 0 0 250 75 0 0 20 0 19 0 1 1 1"
	if ppid, ticks, err := procStat([]byte(stat)); err != nil || ppid != 1 || ticks != 325 {
		t.Errorf("stat: ppid %d ticks %d %v", ppid, ticks, err)
	}
	if _, _, err := procStat([]byte("12 (x) S 1 2")); err == nil {
		t.Error("a short stat: no error")
	}
	rollup := "00400000-7ffdba35d000 ---p 00000000 00:00 0   [rollup]\nRss:               44572 kB\nPss:               14006 kB\nPss_Dirty:         13368 kB\n"
	if rss, pss := rollupKiB([]byte(rollup)); rss != 44572 || pss != 14006 {
		t.Errorf("rollup: rss %d pss %d", rss, pss)
	}
	if names, err := lsNames([]byte(`[{"name":"a","state":"running"},{"name":"b"}]`)); err != nil || !slices.Equal(names, []string{"a", "b"}) {
		t.Errorf("ls: %v %v", names, err)
	}
	if _, err := lsNames([]byte("NAME STATE\n")); err == nil {
		t.Error("ls: not JSON, no error")
	}
	if percent(1, 0) != 0 || percent(1, 4) != 25 {
		t.Error("percent")
	}
}

func TestCgroupMemoryFile(t *testing.T) {
	v1 := "9:name=systemd:/flmbox-aaa\n4:memory:/flmbox-aaa\n1:cpu,cpuacct:/flmbox-aaa\n0::/\n"
	if got := cgroupMemoryFile(v1); got != "/sys/fs/cgroup/memory/flmbox-aaa/memory.usage_in_bytes" {
		t.Errorf("v1: %q", got)
	}
	if got := cgroupMemoryFile("4:cpu,memory:/a/b\n"); got != "/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes" {
		t.Errorf("v1, memory with another controller: %q", got)
	}
	if got := cgroupMemoryFile("9:name=systemd:/x\n"); got != "" {
		t.Errorf("no memory controller: %q", got)
	}
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	if got, want := cgroupMemoryFile("0::/system.slice/flmbox-aaa\n"), "/sys/fs/cgroup/system.slice/flmbox-aaa/memory.current"; (err == nil) != (got == want) {
		t.Errorf("v2: %q (cgroup v2 here: %t)", got, err == nil)
	}
	// This process's own cgroup is not a sandbox's.
	if got := cgroupKiB("/proc", []int{os.Getpid()}); got != 0 {
		t.Errorf("the test's own cgroup: %d KiB", got)
	}
}

// fakeProc writes a /proc with the files readLimits reads.
func fakeProc(t *testing.T, memKiB, pidMax, threadsMax, tasks int64) string {
	t.Helper()
	dir := t.TempDir()
	for path, data := range map[string]string{
		"meminfo":                "MemTotal: 24683792 kB\nMemAvailable: " + strconv.FormatInt(memKiB, 10) + " kB\n",
		"sys/kernel/pid_max":     strconv.FormatInt(pidMax, 10) + "\n",
		"sys/kernel/threads-max": strconv.FormatInt(threadsMax, 10) + "\n",
		"loadavg":                "0.1 0.2 0.3 2/" + strconv.FormatInt(tasks, 10) + " 999\n",
		"sys/fs/file-nr":         "4000\t0\t2466290\n",
	} {
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLimits(t *testing.T) {
	// 23 GiB free: memory allows (23-1) GiB / 25 MiB = 901; pid_max 65536
	// with 1823 tasks allows (65536-1823-2000)/35 = 1763.
	l, err := readLimits(fakeProc(t, 23<<20, 65536, 192739, 1823), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if l.MaxSandboxes != 901 || !strings.Contains(l.CappedBy, "free memory") || l.PidMax != 65536 || l.Tasks != 1823 || l.FilesOpen != 4000 {
		t.Errorf("limits %+v", l)
	}
	if l.DiskFreeBytes <= 0 || l.MaxSuspended != int(l.DiskFreeBytes/densityDiskPerSuspend) {
		t.Errorf("disk: %+v", l)
	}
	if err := l.check(500, min(2000, l.MaxSuspended)); err != nil {
		t.Errorf("500: %v", err)
	}
	err = l.check(1000, 1)
	if !errors.Is(err, ErrHostLimit) || !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "at most 901") ||
		!strings.Contains(err.Error(), "MemAvailable 23.0 GiB") || strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("1000: %v", err)
	}
	if err := l.check(1, l.MaxSuspended+1); !errors.Is(err, ErrHostLimit) || !strings.Contains(err.Error(), "free disk") {
		t.Errorf("too many suspended: %v", err)
	}
	// This VM's pid_max, 32768, caps the count before memory does:
	// (32768-1823-2000)/35 = 827.
	l, err = readLimits(fakeProc(t, 23<<20, 32768, 192739, 1823), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if l.MaxSandboxes != 827 || !strings.Contains(l.CappedBy, "kernel.pid_max 32768") {
		t.Errorf("pid_max: %+v", l)
	}
	if err := l.check(900, 1); err == nil || !strings.Contains(err.Error(), "kernel.pid_max 32768 (1823 tasks running, about 35 a sandbox) allows at most 827") {
		t.Errorf("pid_max: %v", err)
	}
	// Less free memory than the reserve: none.
	if l, err = readLimits(fakeProc(t, 512<<10, 32768, 192739, 100), t.TempDir()); err != nil || l.MaxSandboxes != 0 {
		t.Errorf("no memory: %+v %v", l, err)
	}
	if _, err := readLimits(t.TempDir(), t.TempDir()); err == nil {
		t.Error("no /proc: no error")
	}
}

// TestSandboxProcs finds a container's processes in a fake /proc: those
// whose command line ends with its ID, and their descendants.
func TestSandboxProcs(t *testing.T) {
	proc := t.TempDir()
	add := func(pid, ppid int, cmdline ...string) {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := strconv.Itoa(pid) + " (exe) S " + strconv.Itoa(ppid) + " 1 1 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1"
		os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644)
		var b []byte
		for _, a := range cmdline {
			b = append(append(b, a...), 0)
		}
		os.WriteFile(filepath.Join(dir, "cmdline"), b, 0o644)
	}
	add(10, 1, "runsc-gofer", "--root=/r", "gofer", "--bundle", "/b", "flmbox-aaa")
	add(11, 1, "runsc-sandbox", "--root=/r", "boot", "flmbox-aaa")
	add(12, 11) // a stub: no command line
	add(13, 12)
	add(20, 1, "runsc-sandbox", "boot", "flmbox-bbb") // not asked for
	add(21, 20)
	add(30, 1, "sleep", "flmbox-aaa-not")
	add(31, 11, "runsc-sandbox", "--root=/r", "boot", "flmbox-aaa") // forked, not exec'd
	os.MkdirAll(filepath.Join(proc, "self"), 0o755)
	got, err := sandboxProcs(proc, map[string]bool{"flmbox-aaa": true, "flmbox-ccc": true})
	if err != nil {
		t.Fatal(err)
	}
	pids := slices.Sorted(slices.Values(got["flmbox-aaa"]))
	if !slices.Equal(pids, []int{10, 11, 12, 13, 31}) || len(got) != 1 {
		t.Fatalf("processes %v, want flmbox-aaa: 10 11 12 13 31", got)
	}
	if ticks := cpuTicks(proc, pids); ticks != 35 {
		t.Errorf("ticks %d, want 35", ticks)
	}
}

// TestUsageOf measures this test process and one of its threads (a task
// sharing its address space and descriptor table, as systrap's stubs share
// the sentry's): each is counted once; a child process has its own.
func TestUsageOf(t *testing.T) {
	self := os.Getpid()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var tid int
	for _, e := range tasks {
		if n, _ := strconv.Atoi(e.Name()); n != self {
			tid = n
		}
	}
	if tid == 0 {
		t.Skip("the test process has no thread but its main one")
	}
	alone := usageOf("/proc", []int{self})
	if alone.processes != 1 || alone.tasks < 2 || alone.fds < 3 || alone.pss <= 0 || alone.rss < alone.pss {
		t.Fatalf("usage %+v", alone)
	}
	both := usageOf("/proc", []int{self, tid})
	if both.processes != 2 || both.pss > alone.pss*3/2 || both.fds > alone.fds*3/2 {
		t.Fatalf("a process and its thread: %+v; the process alone: %+v (want its memory and descriptors once)", both, alone)
	}
	if gone := usageOf("/proc", []int{1 << 30}); gone.processes != 0 {
		t.Fatalf("a process that does not exist: %+v", gone)
	}
}

func TestPick(t *testing.T) {
	var sbs []*sandbox.Sandbox
	for i := range 10 {
		sbs = append(sbs, &sandbox.Sandbox{Name: strconv.Itoa(i)})
	}
	got := pick(sbs, 5)
	seen := map[string]bool{}
	for _, sb := range got {
		seen[sb.Name] = true
	}
	if len(got) != 5 || len(seen) != 5 {
		t.Errorf("pick 5 of 10: %d, %d distinct", len(got), len(seen))
	}
	if got := pick(sbs[:2], 5); len(got) != 2 {
		t.Errorf("pick 5 of 2: %d", len(got))
	}
	if got := pickN(sbs[:1], 6); len(got) != 6 || got[5].Name != "0" {
		t.Errorf("pickN 6 of 1: %d", len(got))
	}
	if got := pickN(sbs, 6); len(got) != 6 {
		t.Errorf("pickN 6 of 10: %d", len(got))
	}
}

func TestEach(t *testing.T) {
	var n, at, most atomic.Int64
	each(t.Context(), 20, 3, func(i int) {
		now := at.Add(1)
		for {
			m := most.Load()
			if now <= m || most.CompareAndSwap(m, now) {
				break
			}
		}
		n.Add(int64(i))
		at.Add(-1)
	})
	if n.Load() != 190 || most.Load() > 3 {
		t.Errorf("sum %d (want 190), at most %d at once", n.Load(), most.Load())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var ran atomic.Int64
	each(ctx, 20, 3, func(int) { ran.Add(1) })
	if ran.Load() != 0 {
		t.Errorf("ran %d after cancel", ran.Load())
	}
}

func TestDensityOptions(t *testing.T) {
	valid := func(change func(*Options)) Options {
		o := Defaults(true)
		o.Root, o.Flmbox = "/r", "/bin/flmbox"
		change(&o)
		return o
	}
	for _, tc := range []struct {
		name   string
		change func(*Options)
		err    string
	}{
		{"none", func(o *Options) {}, ""},
		{"500", func(o *Options) { o.Density = 500 }, ""},
		{"500 and 2000 suspended, alone", func(o *Options) { o.Density, o.DensitySuspended, o.DensityOnly = 500, 2000, true }, ""},
		{"negative", func(o *Options) { o.Density = -1 }, "density -1: want 0 (none) to 10000"},
		{"too many", func(o *Options) { o.Density = 10001 }, "density 10001"},
		{"too many suspended", func(o *Options) { o.Density, o.DensitySuspended = 1, 10001 }, "density suspended 10001"},
		{"suspended without a count", func(o *Options) { o.DensitySuspended = 5 }, "no density count"},
		{"alone without a count", func(o *Options) { o.DensityOnly = true }, "no density count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := valid(tc.change).validate()
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error %v, want an invalid argument with %q", err, tc.err)
			}
		})
	}
	if o := (Options{Density: 7}); o.densitySuspended() != 7 {
		t.Error("suspended count: not the density")
	}
	if o := (Options{Density: 7, DensitySuspended: 20}); o.densitySuspended() != 20 {
		t.Error("suspended count: not its own")
	}
}

// TestRunRefusesHostLimit: a density that the host's memory cannot hold is
// refused before anything is made.
func TestRunRefusesHostLimit(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	o := Defaults(true)
	o.Root, o.Flmbox, o.Density = root, "/nonexistent/flmbox", 10000
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Skip(err)
	}
	if avail, _ := meminfoKiB(b, "MemAvailable"); avail > 200<<20 {
		t.Skip("this host holds 10000 sandboxes")
	}
	_, err = Run(t.Context(), o)
	if !errors.Is(err, ErrHostLimit) || !strings.Contains(err.Error(), "density 10000") {
		t.Fatalf("density 10000: %v", err)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the state root was made: %v", err)
	}
}

// sampleDensity is a density section as a run of 10 fills it.
func sampleDensity() *Density {
	s := func(m float64) Stats { return Stats{Median: m, Min: m - 1, Max: m + 1, N: 3} }
	sp := func(m float64) *Stats { x := s(m); return &x }
	d := &Density{Sandboxes: 10, Suspended: 10,
		Limits: DensityLimits{MemAvailableKiB: 23 << 20, PidMax: 32768, ThreadsMax: 192739, Tasks: 1823, FileMax: 2466290, FilesOpen: 4000,
			NoFile: 20000, DiskFreeBytes: 69 << 30, MaxSandboxes: 901, CappedBy: "free memory (MemAvailable 23.0 GiB)", MaxSuspended: 8832}}
	for _, name := range []string{"default", "lazy"} {
		ser := DensitySeries{Name: name, Checked: 10, NotAnswering: 1, FirstFailure: "bench-density-default-3: dead", RemoveMS: s(80)}
		for _, n := range []int{1, 10} {
			ser.Points = append(ser.Points, DensityPoint{Sandboxes: n, MemAvailableDropKiB: int64(n) * 24 << 10, MemPerSandboxKiB: 24 << 10,
				PSSPerSandboxKiB: int64(30-n) << 10, PSSKiB: s(float64(30-n) * 1024), ProcessesPerSandbox: 7, TasksPerSandbox: 35, FDsPerSandbox: 171,
				CreateMS: s(200 + float64(n)), ListMS: s(0.1 * float64(n)), CLIListMS: s(30 + float64(n)),
				FirstCallMS: sp(12), CallMS: sp(4), CLICallMS: sp(15), HostCPUPercent: 1.5, SandboxCPUPercent: 0.25})
		}
		d.Series = append(d.Series, ser)
	}
	ser := DensitySeries{Name: "suspended", Checked: 10, RemoveMS: s(60)}
	for _, n := range []int{1, 10} {
		ser.Points = append(ser.Points, DensityPoint{Sandboxes: n, CreateMS: s(210), SuspendMS: sp(150), ResumeMS: sp(180), CLIResumeMS: sp(200),
			DiskPerSandboxBytes: 5 << 20, ImageBytes: 4800 << 10, ListMS: s(0.2), CLIListMS: s(31), MemPerSandboxKiB: 100})
	}
	d.Series = append(d.Series, ser)
	return d
}

func TestDensityTable(t *testing.T) {
	rep := sampleReport(true, true)
	rep.Density = sampleDensity()
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"FIGURE", // the other sections too
		"density: idle sandboxes made one after another (Manager.Create), measured at 1 and every tenth of 10; 10 suspended",
		"host limits: at most 901 running sandboxes (set by free memory (MemAvailable 23.0 GiB)), 8832 suspended (free disk 69.0 GiB)",
		"default spares: called at the end: 9 of 10 answered; remove 80.0 (79.0–81.0)", "first failure: bench-density-default-3: dead",
		"lazy spares: called at the end", "SANDBOXES  MEM/SB", "PSS/SB", "CGROUP/SB", "CREATE ms", "WARM CALL ms", "RUN --SANDBOX ms", "SANDBOX LS ms", "TASKS/SB", "FDS/SB",
		"24.0 MiB", "29.0 MiB", "20.0 MiB", "201 (200–202)", "210 (209–211)", "1.04×", "0.69×", "1.0 (0.0–2.0)", "10.00×", "1.5 %", "0.2 %", "35.0", "171.0",
		"10 vs 1",
		"suspended (default spares, each suspended right after its create): resumed, called and removed at the end: 10 of 10 answered",
		"DISK/SB", "IMAGE", "SUSPEND ms", "RESUME+CALL ms", "5.0 MiB", "4.7 MiB", "150 (149–151)", "180 (179–181)",
		"targets at 500 (issue 31)", "runsc:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	// Alone, only the density section and the image and runsc lines.
	rep.Settings.DensityOnly = true
	buf.Reset()
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); strings.Contains(out, "FIGURE") || !strings.HasPrefix(out, "density: ") || !strings.Contains(out, "image:  ") {
		t.Errorf("density alone:\n%s", out)
	}
	// Without it, no density section.
	rep = sampleReport(true, true)
	buf.Reset()
	rep.WriteTable(&buf)
	if strings.Contains(buf.String(), "density") {
		t.Errorf("no density section, yet:\n%s", buf.String())
	}
	if fmtStats(Stats{}) != "n/a" || fmtStats(Stats{Median: 3, Min: 3, Max: 3, N: 1}) != "3.0" {
		t.Error("fmtStats")
	}
}

func TestDensityJSON(t *testing.T) {
	rep := sampleReport(true, true)
	var buf bytes.Buffer
	rep.WriteJSON(&buf)
	if strings.Contains(buf.String(), "density") {
		t.Fatalf("no density section, yet: %s", buf.String())
	}
	rep.Density = sampleDensity()
	buf.Reset()
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Density map[string]any `json:"density"`
	}
	if err := json.Unmarshal(buf.Bytes(), &obj); err != nil {
		t.Fatal(err)
	}
	keys := func(v any) []string {
		m, _ := v.(map[string]any)
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	d := obj.Density
	if got := keys(d); !slices.Equal(got, []string{"limits", "sandboxes", "series", "suspended"}) {
		t.Errorf("density: %v", got)
	}
	if got := keys(d["limits"]); !slices.Equal(got, []string{"capped_by", "disk_free_bytes", "file_max", "files_open", "max_sandboxes",
		"max_suspended", "mem_available_kib", "nofile", "pid_max", "tasks", "threads_max"}) {
		t.Errorf("density.limits: %v", got)
	}
	series := d["series"].([]any)
	if len(series) != 3 {
		t.Fatalf("series: %d", len(series))
	}
	if got := keys(series[0]); !slices.Equal(got, []string{"checked", "first_failure", "name", "not_answering", "points", "remove_ms"}) {
		t.Errorf("density.series[0]: %v", got)
	}
	running := series[0].(map[string]any)["points"].([]any)[0]
	if got := keys(running); !slices.Equal(got, []string{"call_ms", "cgroup_per_sandbox_kib", "cli_call_ms", "cli_list_ms", "create_ms", "fds_per_sandbox", "first_call_ms",
		"host_cpu_percent", "list_ms", "mem_available_drop_kib", "mem_per_sandbox_kib", "processes_per_sandbox", "pss_kib",
		"pss_per_sandbox_kib", "sandbox_cpu_percent", "sandboxes", "tasks_per_sandbox"}) {
		t.Errorf("density.series[0].points[0]: %v", got)
	}
	suspended := series[2].(map[string]any)["points"].([]any)[0]
	for _, k := range []string{"suspend_ms", "resume_ms", "cli_resume_ms", "disk_per_sandbox_bytes", "image_bytes"} {
		if !slices.Contains(keys(suspended), k) {
			t.Errorf("density.series[2].points[0] lacks %s: %v", k, keys(suspended))
		}
	}
	if got := keys(series[2]); slices.Contains(got, "first_failure") {
		t.Errorf("density.series[2]: %v", got)
	}
}
