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
	// user nice system idle iowait irq softirq steal guest guest_nice
	busy, total, err := cpuTimes([]byte("cpu  100 5 50 1000 20 3 2 0 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"))
	if err != nil || busy != 160 || total != 1180 {
		t.Errorf("cpu: busy %d total %d %v; want 160 and 1180", busy, total, err)
	}
	if _, _, err := cpuTimes([]byte("intr 1 2 3\n")); err == nil {
		t.Error("no cpu line: no error")
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

func TestLimits(t *testing.T) {
	const gib = 1 << 30
	limits := func(pidRoom int64) []sandbox.HostLimit {
		return []sandbox.HostLimit{
			{Name: sandbox.LimitPidMax, Value: 32768, Used: 1823, PerSandbox: 40, Sandboxes: pidRoom},
			{Name: sandbox.LimitNofile, Value: 20000, Used: 231, PerSandbox: 231, Sandboxes: -1},
			// 23 GiB free: (23-1) GiB / 24 MiB = 938 kept to everyone else's 1 GiB.
			{Name: sandbox.LimitMemory, Value: 24 * gib, Used: 1 * gib, PerSandbox: 24 << 20, Sandboxes: 981},
		}
	}
	n, why := capacity(limits(2000))
	if n != 938 || !strings.Contains(why, "free memory (23.0 GiB available, about 24 MiB a sandbox, 1 GiB kept free)") {
		t.Errorf("memory bound: %d, %q", n, why)
	}
	n, why = capacity(limits(773))
	if n != 773 || why != "kernel.pid_max 32768 (1823 in use, about 40 a sandbox)" {
		t.Errorf("pid_max bound: %d, %q", n, why)
	}
	if n, _ := capacity(nil); n != -1 {
		t.Errorf("no limits known: %d", n)
	}
	l := DensityLimits{MaxSandboxes: 773, CappedBy: why, DiskFreeBytes: 64 << 30, MaxSuspended: 8192}
	if err := l.check(500, 2000); err != nil {
		t.Errorf("500: %v", err)
	}
	err := l.check(1000, 1)
	if !errors.Is(err, ErrHostLimit) || !errdefs.IsResourceExhausted(err) || strings.Count(err.Error(), "\n") != 0 ||
		!strings.Contains(err.Error(), "density 1000: kernel.pid_max 32768 (1823 in use, about 40 a sandbox) allows at most 773") {
		t.Errorf("1000: %v", err)
	}
	if err := l.check(1, l.MaxSuspended+1); !errors.Is(err, ErrHostLimit) || !strings.Contains(err.Error(), "free disk") {
		t.Errorf("too many suspended: %v", err)
	}
	// This host's own limits are read.
	if l, err := readLimits(t.TempDir()); err != nil || len(l.Limits) == 0 || l.DiskFreeBytes <= 0 || l.MaxSuspended != int(l.DiskFreeBytes/densityDiskPerSuspend) {
		t.Errorf("readLimits: %+v, %v", l, err)
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
		Limits: DensityLimits{Limits: []sandbox.HostLimit{{Name: sandbox.LimitMemory, Value: 24 << 30, Used: 1 << 30, PerSandbox: 24 << 20, Sandboxes: 981}},
			DiskFreeBytes: 69 << 30, MaxSandboxes: 938, CappedBy: "free memory (23.0 GiB available, about 24 MiB a sandbox, 1 GiB kept free)", MaxSuspended: 8832}}
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
		"host limits: at most 938 running sandboxes (set by free memory (23.0 GiB available, about 24 MiB a sandbox, 1 GiB kept free)), 8832 suspended (free disk 69.0 GiB)",
		"default spares: called at the end: 9 of 10 answered; remove 80.0 (79.0–81.0)", "first failure: bench-density-default-3: dead",
		"lazy spares: called at the end", "SANDBOXES  MEM/SB", "PSS/SB", "CGROUP/SB", "CREATE ms", "WARM CALL ms", "RUN --SANDBOX ms", "SANDBOX LS ms", "TASKS/SB", "FDS/SB",
		"24.0 MiB", "29.0 MiB", "20.0 MiB", "201 (200–202)", "210 (209–211)", "1.04×", "0.69×", "1.0 (0.0–2.0)", "10.00×", "1.5 %", "0.2 %", "35.0", "171.0",
		"10 vs 1",
		"suspended (default spares, each suspended right after its create): resumed, called and removed at the end: 10 of 10 answered",
		"DISK/SB", "IMAGE", "SUSPEND ms", "RESUME+CALL ms", "5.0 MiB", "4.7 MiB", "150 (149–151)", "180 (179–181)",
		"targets at 500:", "runsc:",
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
	if got := keys(d["limits"]); !slices.Equal(got, []string{"capped_by", "disk_free_bytes", "limits", "max_sandboxes", "max_suspended"}) {
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
