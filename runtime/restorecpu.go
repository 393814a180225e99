package runtime

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/flmbox/flmbox/internal/mountinfo"
)

// A restore's CPU quota.
//
// Restoring a sandbox is gVisor's own burst of work, not its processes'
// (its kernel's state decoded on one thread while its memory loads on
// another), and a quota of one CPU throttles it. The sandbox's processes see
// no difference: runsc gives a sandbox max(2, ceil(quota)) CPUs (capped at
// the host's), and a restored kernel keeps the CPU count it was saved with.
// So Restore starts the container from a copy of its bundle whose quota is
// raised to that many CPUs, and writes the spec's own quota into the
// container's cgroup once runsc is done, before it returns: no call can
// reach the sandbox before its limit holds again.

// restoreDir is the directory in a bundle that holds the copy of its spec
// that runsc restores the container from, and the container's pid file.
const restoreDir = "restore"

// minSandboxCPUs is the fewest CPUs runsc gives a sandbox, whatever its
// quota (runsc/sandbox: "Dropping below 2 CPUs can trigger application to
// disable locks").
const minSandboxCPUs = 2

// restoreQuota returns the CPU quota a restore of a container with limit
// cpu runs under, and whether it differs from the limit's own.
func restoreQuota(cpu *specs.LinuxCPU) (int64, bool) {
	if cpu == nil || cpu.Quota == nil || *cpu.Quota <= 0 || cpu.Period == nil || *cpu.Period == 0 {
		return 0, false
	}
	cpus := max(minSandboxCPUs, math.Ceil(float64(*cpu.Quota)/float64(*cpu.Period)))
	q := int64(cpus) * int64(*cpu.Period)
	return q, q > *cpu.Quota
}

// restoreBundle returns the bundle directory runsc restores the container
// of bundle from: a copy of its spec with the quota restoreQuota gives (and
// its relative paths made absolute: runsc resolves them against the bundle
// it gets), in bundle's restoreDir, and the limit to set once it runs (nil
// if none: the spec has no quota to raise) with the name of the cgroup runsc
// makes for it. Either way the directory is fresh; the caller removes it.
func restoreBundle(bundle, id string) (dir string, cpu *specs.LinuxCPU, cgroup string, err error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", nil, "", fmt.Errorf("read the container's bundle: %w: %w", err, errdefs.ErrDataLoss)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", nil, "", fmt.Errorf("read the container's bundle: %w: %w", err, errdefs.ErrDataLoss)
	}
	if spec.Root != nil && spec.Root.Path != "" && !filepath.IsAbs(spec.Root.Path) {
		spec.Root.Path = filepath.Join(bundle, spec.Root.Path)
	}
	for i, m := range spec.Mounts {
		if m.Type == "bind" && m.Source != "" && !filepath.IsAbs(m.Source) {
			spec.Mounts[i].Source = filepath.Join(bundle, m.Source)
		}
	}
	dir = filepath.Join(bundle, restoreDir)
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, "", fmt.Errorf("write the container's restore bundle: %w: %w", err, errdefs.ErrUnavailable)
	}
	if spec.Linux != nil && spec.Linux.Resources != nil {
		if q, raise := restoreQuota(spec.Linux.Resources.CPU); raise {
			cpu = spec.Linux.Resources.CPU
			raised := *cpu
			raised.Quota = &q
			spec.Linux.Resources.CPU = &raised
			cgroup = cgroupName(spec.Linux.CgroupsPath, id)
		}
	}
	if b, err = json.Marshal(&spec); err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
	}
	if err != nil {
		return "", nil, "", fmt.Errorf("write the container's restore bundle: %w: %w", err, errdefs.ErrUnavailable)
	}
	return dir, cpu, cgroup, nil
}

// setCPUQuota writes cpu's quota into cgroup, the cgroup runsc made for a
// container whose sandbox process is pid. A sandbox process in no cgroup of
// that name is in none runsc made (runsc did not manage its cgroups): no
// quota, raised or not, ever applied to it, and nothing is written.
func setCPUQuota(pid int, cgroup string, cpu *specs.LinuxCPU) error {
	procCgroup, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Errorf("find the container's cgroup: %w: %w", err, errdefs.ErrUnavailable)
	}
	mounts, err := mountinfo.Read()
	if err != nil {
		return fmt.Errorf("find the container's cgroup: %w: %w", err, errdefs.ErrUnavailable)
	}
	file, value, err := cpuQuotaFile(string(procCgroup), mounts, cgroup, cpu)
	if err != nil || file == "" {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0) // never a new file
	if err == nil {
		_, err = f.WriteString(value)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("set the container's CPU quota: %w: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// cpuQuotaFile returns the file to write cpu's quota to, and what to
// write, for a process whose /proc/PID/cgroup is procCgroup, if its cgroup
// is named cgroup (else no file): cpu.cfs_quota_us in the cgroup v1
// hierarchy with the cpu controller (a hybrid host's v2 line is not
// runsc's), cpu.max under cgroup v2 alone. The cgroup's path is where
// mounts (this process's mount table) mounts that hierarchy's
// root, so that nested hosts (a hierarchy mounted from a cgroup of its own)
// work too; a path outside every such mount is an error.
func cpuQuotaFile(procCgroup string, mounts []mountinfo.Mount, cgroup string, cpu *specs.LinuxCPU) (file, value string, err error) {
	path, v1 := "", false
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(line, ":", 3)
		switch {
		case len(f) != 3:
		case f[0] == "0":
			if !v1 {
				path = f[2]
			}
		case hasController(f[1], "cpu"):
			path, v1 = f[2], true
		}
	}
	if path == "" || filepath.Base(path) != cgroup {
		return "", "", nil
	}
	value = strconv.FormatInt(*cpu.Quota, 10)
	name := "cpu.cfs_quota_us"
	if !v1 {
		value += " " + strconv.FormatUint(*cpu.Period, 10)
		name = "cpu.max"
	}
	for _, m := range mounts {
		if v1 && (m.Type != "cgroup" || !hasController(m.SuperOptions, "cpu")) || !v1 && m.Type != "cgroup2" {
			continue
		}
		rel, err := filepath.Rel(m.Root, path)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			continue
		}
		return filepath.Join(m.Point, rel, name), value, nil
	}
	return "", "", fmt.Errorf("find the container's cgroup %s: no cgroup hierarchy mounted here holds it: %w", path, errdefs.ErrUnavailable)
}

// hasController reports whether a comma-separated list of cgroup
// controllers (or mount options) holds name.
func hasController(list, name string) bool { return slices.Contains(strings.Split(list, ","), name) }
