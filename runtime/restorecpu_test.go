package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func cpuLimit(quota int64, period uint64) *specs.LinuxCPU {
	return &specs.LinuxCPU{Quota: &quota, Period: &period}
}

func TestRestoreQuota(t *testing.T) {
	for _, c := range []struct {
		name  string
		cpu   *specs.LinuxCPU
		want  int64
		raise bool
	}{
		{"none", nil, 0, false},
		{"no quota", &specs.LinuxCPU{}, 0, false},
		{"unlimited", cpuLimit(-1, 100000), 0, false},
		{"one CPU: raised to the two runsc gives", cpuLimit(100000, 100000), 200000, true},
		{"half a CPU", cpuLimit(25000, 50000), 100000, true},
		{"1.5 CPUs", cpuLimit(150000, 100000), 200000, true},
		{"2 CPUs: as is", cpuLimit(200000, 100000), 200000, false},
		{"2.5 CPUs: 3", cpuLimit(250000, 100000), 300000, true},
	} {
		got, raise := restoreQuota(c.cpu)
		if raise != c.raise || raise && got != c.want {
			t.Errorf("%s: restoreQuota = %d, %v; want %d, %v", c.name, got, raise, c.want, c.raise)
		}
	}
}

// TestRestoreBundle checks the restore bundle's spec: the same as the
// bundle's but for its CPU quota, and the limit Restore sets afterwards.
func TestRestoreBundle(t *testing.T) {
	bundle := t.TempDir()
	pids := int64(64)
	spec := &specs.Spec{Version: specs.Version, Root: &specs.Root{Path: "/rootfs", Readonly: true},
		Linux: &specs.Linux{Resources: &specs.LinuxResources{CPU: cpuLimit(100000, 100000), Pids: &specs.LinuxPids{Limit: &pids}}}}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	dir, cpu, err := restoreBundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if dir != filepath.Join(bundle, restoreDir) || cpu == nil || *cpu.Quota != 100000 {
		t.Fatalf("restoreBundle = %q, %+v; want its restore directory and the quota of 100000", dir, cpu)
	}
	var got specs.Spec
	b, err = os.ReadFile(filepath.Join(dir, "config.json"))
	if err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil {
		t.Fatal(err)
	}
	if q := got.Linux.Resources.CPU; *q.Quota != 200000 || *q.Period != 100000 {
		t.Errorf("restore bundle's CPU limit = %d/%d, want 200000/100000", *q.Quota, *q.Period)
	}
	if *got.Linux.Resources.Pids.Limit != 64 || got.Root.Path != "/rootfs" {
		t.Errorf("restore bundle's spec changed more than its quota: %+v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(bundle, "config.json")); !json.Valid(b) || string(b) != string(mustJSON(t, spec)) {
		t.Errorf("the bundle's own config.json changed")
	}

	// No quota to raise: the copy is the spec as it is, and no limit is set afterwards.
	spec.Linux.Resources.CPU = nil
	os.WriteFile(filepath.Join(bundle, "config.json"), mustJSON(t, spec), 0o600)
	if _, cpu, err := restoreBundle(bundle); err != nil || cpu != nil {
		t.Errorf("restoreBundle of a spec without a quota = %+v, %v; want no limit", cpu, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCPUQuotaFile(t *testing.T) {
	cpu := cpuLimit(50000, 100000)
	const id = "flmbox-a"
	for _, c := range []struct {
		name, cgroup, file, value string
	}{
		{"v1", "12:pids:/flmbox-a\n4:cpu,cpuacct:/flmbox-a\n1:name=systemd:/flmbox-a\n", "/sys/fs/cgroup/cpu/flmbox-a/cpu.cfs_quota_us", "50000"},
		{"v1, nested", "4:cpu:/kubepods/pod1/flmbox-a\n", "/sys/fs/cgroup/cpu/kubepods/pod1/flmbox-a/cpu.cfs_quota_us", "50000"},
		{"v2", "0::/flmbox-a\n", "/sys/fs/cgroup/flmbox-a/cpu.max", "50000 100000"},
		{"hybrid: the v1 cpu hierarchy, never v2's line", "0::/flmbox-a\n4:cpu,cpuacct:/flmbox-a\n", "/sys/fs/cgroup/cpu/flmbox-a/cpu.cfs_quota_us", "50000"},
		{"hybrid without a cpu hierarchy: v2's line is not runsc's", "0::/flmbox-a\n3:pids:/flmbox-a\n", "", ""},
		{"v1, the caller's cgroup: runsc made none", "4:cpu,cpuacct:/\n", "", ""},
		{"v1, another's cgroup", "4:cpu,cpuacct:/user.slice\n", "", ""},
		{"v2, the caller's cgroup", "0::/user.slice/session-1.scope\n", "", ""},
	} {
		file, value := cpuQuotaFile(c.cgroup, id, cpu)
		if file != c.file || value != c.value {
			t.Errorf("%s: cpuQuotaFile = %q, %q; want %q, %q", c.name, file, value, c.file, c.value)
		}
	}
}
