package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/flmbox/flmbox/internal/mountinfo"
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
	dir, cpu, cgroup, err := restoreBundle(bundle, "flmbox-a")
	if err != nil {
		t.Fatal(err)
	}
	if dir != filepath.Join(bundle, restoreDir) || cpu == nil || *cpu.Quota != 100000 || cgroup != "flmbox-a" {
		t.Fatalf("restoreBundle = %q, %+v, %q; want its restore directory, the quota of 100000 and the container's cgroup", dir, cpu, cgroup)
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

	// Relative paths are the bundle's, not the copy's.
	spec.Root.Path = "rootfs"
	spec.Mounts = []specs.Mount{{Destination: "/data", Type: "bind", Source: "data"}}
	os.WriteFile(filepath.Join(bundle, "config.json"), mustJSON(t, spec), 0o600)
	if dir, _, _, err = restoreBundle(bundle, "flmbox-a"); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(filepath.Join(dir, "config.json"))
	got = specs.Spec{}
	json.Unmarshal(b, &got)
	if got.Root.Path != filepath.Join(bundle, "rootfs") || got.Mounts[0].Source != filepath.Join(bundle, "data") {
		t.Errorf("restore bundle's root %q and bind source %q: want them in %s", got.Root.Path, got.Mounts[0].Source, bundle)
	}

	// No quota to raise: the copy is the spec as it is, and no limit is set afterwards.
	spec.Linux.Resources.CPU = nil
	os.WriteFile(filepath.Join(bundle, "config.json"), mustJSON(t, spec), 0o600)
	if _, cpu, _, err := restoreBundle(bundle, "flmbox-a"); err != nil || cpu != nil {
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
	const (
		v1Mounts = "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
			"31 25 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n" +
			"40 25 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
		// A container's view without a cgroup namespace: its hierarchies are
		// mounted from its own cgroup.
		nestedMounts = "30 25 0:26 /docker/c1 /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
		v2Mounts     = "40 25 0:35 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
	)
	for _, c := range []struct {
		name, cgroup, mounts, file, value string
		fails                             bool
	}{
		{"v1", "12:pids:/flmbox-a\n4:cpu:/flmbox-a\n1:name=systemd:/flmbox-a\n0::/\n", v1Mounts, "/sys/fs/cgroup/cpu/flmbox-a/cpu.cfs_quota_us", "50000", false},
		{"v1, nested without a cgroup namespace", "4:cpu,cpuacct:/docker/c1/flmbox-a\n", nestedMounts, "/sys/fs/cgroup/cpu,cpuacct/flmbox-a/cpu.cfs_quota_us", "50000", false},
		{"v2", "0::/flmbox-a\n", v2Mounts, "/sys/fs/cgroup/flmbox-a/cpu.max", "50000 100000", false},
		{"hybrid: the v1 cpu hierarchy, never v2's line", "0::/flmbox-a\n4:cpu:/flmbox-a\n", v1Mounts, "/sys/fs/cgroup/cpu/flmbox-a/cpu.cfs_quota_us", "50000", false},
		{"runsc made none: the caller's cgroup", "4:cpu:/\n0::/\n", v1Mounts, "", "", false},
		{"runsc made none: another's cgroup", "4:cpu:/user.slice\n", v1Mounts, "", "", false},
		{"v2, the caller's cgroup", "0::/user.slice/session-1.scope\n", v2Mounts, "", "", false},
		{"a cgroup outside every mount", "4:cpu:/other/flmbox-a\n", nestedMounts, "", "", true},
		{"no cpu hierarchy mounted", "4:cpu:/flmbox-a\n", v2Mounts, "", "", true},
	} {
		file, value, err := cpuQuotaFile(c.cgroup, mountinfo.Parse(c.mounts), "flmbox-a", cpu)
		if file != c.file || value != c.value || (err != nil) != c.fails {
			t.Errorf("%s: cpuQuotaFile = %q, %q, %v; want %q, %q, failing %v", c.name, file, value, err, c.file, c.value, c.fails)
		}
	}
}
