package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
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

// TestBootBundle checks the boot bundle's spec: the same as the bundle's but
// for the memory the sandbox is shown and a restore's quota, and what Run and
// Restore set afterwards.
func TestBootBundle(t *testing.T) {
	bundle := t.TempDir()
	pids := int64(64)
	mem := int64(768 << 20)
	spec := &specs.Spec{Version: specs.Version, Root: &specs.Root{Path: "/rootfs", Readonly: true},
		Annotations: map[string]string{AnnotationMemory: strconv.Itoa(512 << 20)},
		Linux: &specs.Linux{Resources: &specs.LinuxResources{CPU: cpuLimit(100000, 100000), Memory: &specs.LinuxMemory{Limit: &mem},
			Pids: &specs.LinuxPids{Limit: &pids}}}}
	write := func() {
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), mustJSON(t, spec), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func(dir string) specs.Spec {
		var got specs.Spec
		b, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err == nil {
			err = json.Unmarshal(b, &got)
		}
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	write()

	// Run: shown 512 MiB, the cgroup's own limit set afterwards; the quota
	// as it is.
	dir, after, err := bootBundle(bundle, "flmbox-a", "")
	if err != nil {
		t.Fatal(err)
	}
	if dir != filepath.Join(bundle, bootDir) || after != (afterBoot{cgroup: "flmbox-a", memory: 768 << 20}) {
		t.Fatalf("bootBundle = %q, %+v; want its boot directory and the memory limit of 768 MiB", dir, after)
	}
	got := read(dir)
	if r := got.Linux.Resources; *r.Memory.Limit != 512<<20 || r.CPU.Cpus != "" || *r.CPU.Quota != 100000 || *r.Pids.Limit != 64 || got.Root.Path != "/rootfs" {
		t.Errorf("boot spec: memory %d, cpus %q, quota %d, pids %d, root %q; want 512 MiB, the rest as the bundle's",
			*r.Memory.Limit, r.CPU.Cpus, *r.CPU.Quota, *r.Pids.Limit, got.Root.Path)
	}
	if b, _ := os.ReadFile(filepath.Join(bundle, "config.json")); string(b) != string(mustJSON(t, spec)) {
		t.Errorf("the bundle's own config.json changed")
	}

	// A restore: the quota raised to the two CPUs runsc shows; the memory
	// shown only if the checkpoint fits under it.
	image := t.TempDir()
	os.WriteFile(filepath.Join(image, "pages.img"), make([]byte, 1<<20), 0o600)
	dir, after, err = bootBundle(bundle, "flmbox-a", image)
	if err != nil {
		t.Fatal(err)
	}
	if after.memory != 768<<20 || after.cpu == nil || *after.cpu.Quota != 100000 {
		t.Errorf("restore: afterBoot %+v; want the memory limit and the quota of 100000 set afterwards", after)
	}
	if r := read(dir).Linux.Resources; *r.CPU.Quota != 200000 || *r.CPU.Period != 100000 || *r.Memory.Limit != 512<<20 {
		t.Errorf("restore's boot spec: quota %d/%d, memory %d; want 200000/100000, 512 MiB", *r.CPU.Quota, *r.CPU.Period, *r.Memory.Limit)
	}
	big, _ := os.Create(filepath.Join(image, "pages.img"))
	big.Truncate(512<<20 - restoreMemoryMargin + 1)
	big.Close()
	if dir, after, _ = bootBundle(bundle, "flmbox-a", image); after.memory != 0 || *read(dir).Linux.Resources.Memory.Limit != 768<<20 {
		t.Errorf("restore of a checkpoint too big for 512 MiB: afterBoot %+v; want it booted under the cgroup's own limit", after)
	}

	// Relative paths are the bundle's, not the copy's.
	spec.Root.Path = "rootfs"
	spec.Mounts = []specs.Mount{{Destination: "/data", Type: "bind", Source: "data"}}
	write()
	if dir, _, err = bootBundle(bundle, "flmbox-a", ""); err != nil {
		t.Fatal(err)
	}
	if got := read(dir); got.Root.Path != filepath.Join(bundle, "rootfs") || got.Mounts[0].Source != filepath.Join(bundle, "data") {
		t.Errorf("boot bundle's root %q and bind source %q: want them in %s", got.Root.Path, got.Mounts[0].Source, bundle)
	}

	// No memory shown (bare runsc's spec has no annotation) and no quota:
	// the copy is the spec as it is, and nothing is set afterwards.
	spec.Linux.Resources.CPU = nil
	delete(spec.Annotations, AnnotationMemory)
	write()
	if _, after, err := bootBundle(bundle, "flmbox-a", ""); err != nil || after.memory != 0 || after.cpu != nil {
		t.Errorf("bootBundle of a spec without a quota or a memory shown = %+v, %v; want nothing set", after, err)
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

func TestCgroupDir(t *testing.T) {
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
		name, cgroup, mounts, dir string
		v1, fails                 bool
	}{
		{"v1", "12:pids:/flmbox-a\n4:cpu:/flmbox-a\n1:name=systemd:/flmbox-a\n0::/\n", v1Mounts, "/sys/fs/cgroup/cpu/flmbox-a", true, false},
		{"v1, nested without a cgroup namespace", "4:cpu,cpuacct:/docker/c1/flmbox-a\n", nestedMounts, "/sys/fs/cgroup/cpu,cpuacct/flmbox-a", true, false},
		{"v2", "0::/flmbox-a\n", v2Mounts, "/sys/fs/cgroup/flmbox-a", false, false},
		{"hybrid: the v1 cpu hierarchy, never v2's line", "0::/flmbox-a\n4:cpu:/flmbox-a\n", v1Mounts, "/sys/fs/cgroup/cpu/flmbox-a", true, false},
		{"runsc made none: the caller's cgroup", "4:cpu:/\n0::/\n", v1Mounts, "", false, false},
		{"runsc made none: another's cgroup", "4:cpu:/user.slice\n", v1Mounts, "", false, false},
		{"v2, the caller's cgroup", "0::/user.slice/session-1.scope\n", v2Mounts, "", false, false},
		{"a cgroup outside every mount", "4:cpu:/other/flmbox-a\n", nestedMounts, "", false, true},
		{"no cpu hierarchy mounted", "4:cpu:/flmbox-a\n", v2Mounts, "", false, true},
	} {
		dir, v1, err := cgroupDir(c.cgroup, mountinfo.Parse(c.mounts), "flmbox-a", "cpu")
		if dir != c.dir || v1 != c.v1 || (err != nil) != c.fails {
			t.Errorf("%s: cgroupDir = %q, %v, %v; want %q, %v, failing %v", c.name, dir, v1, err, c.dir, c.v1, c.fails)
		}
	}
}
