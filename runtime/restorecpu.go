package runtime

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A restore's CPU quota.
//
// Restoring a sandbox is gVisor's own burst of work, not its processes':
// its kernel's state is decoded on one thread while its memory loads on
// another. A quota of one CPU throttles that burst (the cgroup's
// nr_throttled grew on every resume of a default sandbox, and its first
// result came 15 to 28 ms later than with the quota out of the way,
// alternating rounds on a 2-core worker). The sandbox's processes see no
// difference: runsc gives a sandbox max(2, ceil(quota)) CPUs (capped at the
// host's), and a restored kernel keeps the CPU count it was saved with. So
// Restore starts the container from a copy of its bundle whose quota is
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
// of bundle from: a copy of its spec with the quota restoreQuota gives, in
// bundle's restoreDir, and the limit to set once it runs (nil if none: the
// spec has no quota to raise). Either way the directory is fresh; the
// caller removes it.
func restoreBundle(bundle string) (dir string, cpu *specs.LinuxCPU, err error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", nil, fmt.Errorf("read the container's bundle: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", nil, fmt.Errorf("read the container's bundle: %w", err)
	}
	dir = filepath.Join(bundle, restoreDir)
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("write the container's restore bundle: %w", err)
	}
	if spec.Linux != nil && spec.Linux.Resources != nil {
		if q, raise := restoreQuota(spec.Linux.Resources.CPU); raise {
			cpu = spec.Linux.Resources.CPU
			raised := *cpu
			raised.Quota = &q
			spec.Linux.Resources.CPU = &raised
		}
	}
	if b, err = json.Marshal(&spec); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return "", nil, fmt.Errorf("write the container's restore bundle: %w", err)
	}
	return dir, cpu, nil
}

// cgroupRoot is where the host's cgroup hierarchies are mounted.
var cgroupRoot = "/sys/fs/cgroup"

// setCPUQuota writes cpu's quota into the cgroup of container id, whose
// sandbox process is pid.
func setCPUQuota(id string, pid int, cpu *specs.LinuxCPU) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Errorf("find the container's cgroup: %w: %w", err, errdefs.ErrUnavailable)
	}
	file, value := cpuQuotaFile(string(b), id, cpu)
	if file == "" {
		return nil // runsc made it no cgroup: its quota never applied
	}
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		return fmt.Errorf("set the container's CPU quota: %w: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// cpuQuotaFile returns the file to write cpu's quota to, and what to
// write, for the sandbox process of container id, whose /proc/PID/cgroup
// is procCgroup: cpu.cfs_quota_us in the cgroup v1 cpu hierarchy (where
// runsc puts its cgroups; a hybrid host's v2 line is not runsc's), cpu.max
// under cgroup v2 alone. The cgroup must be the container's, named for its
// ID as runsc names it: else (runsc made none) there is no file.
func cpuQuotaFile(procCgroup, id string, cpu *specs.LinuxCPU) (file, value string) {
	ours := func(path string) bool { return strings.Contains(filepath.Base(path), id) }
	v1, v2 := false, ""
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(line, ":", 3)
		switch {
		case len(f) != 3:
		case f[0] == "0":
			v2 = f[2]
		case hasController(f[1], "cpu"):
			if !ours(f[2]) {
				return "", ""
			}
			return filepath.Join(cgroupRoot, "cpu", f[2], "cpu.cfs_quota_us"), strconv.FormatInt(*cpu.Quota, 10)
		default:
			v1 = true
		}
	}
	if v1 || !ours(v2) {
		return "", ""
	}
	return filepath.Join(cgroupRoot, v2, "cpu.max"), strconv.FormatInt(*cpu.Quota, 10) + " " + strconv.FormatUint(*cpu.Period, 10)
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
