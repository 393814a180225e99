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

// What a sandbox is shown of its memory, and what its cgroups allow.
//
// gVisor shows a sandbox as much memory (MemTotal) as runsc reads in the
// container's memory cgroup when it starts the sandbox: its limit. flmbox's
// cgroup allows more than a sandbox is given, MemoryBytes plus
// MemoryHeadroom (gVisor's own memory, and time for the agent's memory
// watch), so a --memory 512MiB sandbox saw MemTotal 768 MiB and was killed
// with "287 MiB available". And a restore runs under a raised CPU quota
// (decoding a kernel's state is gVisor's own burst of work, not the
// sandbox's processes').
//
// So Run and Restore start runsc on a copy of the bundle's spec (bootBundle)
// whose memory limit is the sandbox's own (AnnotationMemory) and, for a
// restore, whose quota is raised to the CPUs runsc shows. Once runsc is
// done, before they return, they write the bundle's own limits into the
// container's cgroups (afterBoot.apply). No call reaches the sandbox before
// they hold. A restore is shown its own memory only when its checkpoint is
// far enough below it to be loaded under that limit (restoreMemoryMargin);
// else it is shown its cgroup's limit.
//
// The CPUs are not shown this way: runsc would show ceil(quota) CPUs with a
// cpuset of that many (never fewer than 2 from the quota alone), but gVisor's
// kernel then runs on as many Go threads (GOMAXPROCS), and a warm Python
// call of a one-CPU sandbox took 1.5 times as long. Package sandbox shows a
// one-CPU sandbox's processes one CPU itself (its agent's affinity, and
// files bound over /proc/cpuinfo and /sys/devices/system/cpu/online).

// AnnotationMemory is the spec annotation that holds the memory a sandbox's
// processes are shown as MemTotal, in bytes (WithLimits: Limits.MemoryBytes;
// its cgroup allows more).
const AnnotationMemory = "dev.flmbox.memory"

// bootDir is the directory in a bundle that holds the copy of its spec that
// runsc starts or restores the container from, and the container's pid file.
const bootDir = "boot"

// restoreMemoryMargin is how far below the memory a sandbox is shown its
// checkpoint must be for a restore to run under that limit: gVisor's own
// memory (some 15 to 40 MiB once restored) and what decoding needs beside
// the pages it loads.
const restoreMemoryMargin = 128 << 20

// minSandboxCPUs is the fewest CPUs runsc gives a sandbox from its quota
// alone (runsc/sandbox: "Dropping below 2 CPUs can trigger application to
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

// afterBoot is what Run and Restore write into a container's cgroups once
// runsc has started it: the bundle's own limits, where the boot copy's
// differ.
type afterBoot struct {
	cgroup string          // the name of the container's cgroups (cgroupName)
	memory int64           // the memory limit; 0: as booted
	cpu    *specs.LinuxCPU // the quota; nil: as booted
}

// bootBundle returns the bundle directory runsc starts (restoreImage "")
// or restores (from the checkpoint in restoreImage) the container of bundle
// from, a copy of its spec with the limits the sandbox is shown, and what
// to set once it runs. The copy's relative paths are made absolute: runsc
// resolves them against the bundle it gets. Either way the directory is
// fresh; the caller removes it.
func bootBundle(bundle, id, restoreImage string) (dir string, after afterBoot, err error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", afterBoot{}, fmt.Errorf("read the container's bundle: %w: %w", err, errdefs.ErrDataLoss)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", afterBoot{}, fmt.Errorf("read the container's bundle: %w: %w", err, errdefs.ErrDataLoss)
	}
	if spec.Root != nil && spec.Root.Path != "" && !filepath.IsAbs(spec.Root.Path) {
		spec.Root.Path = filepath.Join(bundle, spec.Root.Path)
	}
	for i, m := range spec.Mounts {
		if m.Type == "bind" && m.Source != "" && !filepath.IsAbs(m.Source) {
			spec.Mounts[i].Source = filepath.Join(bundle, m.Source)
		}
	}
	dir = filepath.Join(bundle, bootDir)
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", afterBoot{}, fmt.Errorf("write the container's boot bundle: %w: %w", err, errdefs.ErrUnavailable)
	}
	if spec.Linux != nil && spec.Linux.Resources != nil {
		after.cgroup = cgroupName(spec.Linux.CgroupsPath, id)
		res := spec.Linux.Resources
		if m := res.Memory; m != nil && m.Limit != nil {
			shown, err := strconv.ParseInt(spec.Annotations[AnnotationMemory], 10, 64)
			if err == nil && shown > 0 && shown < *m.Limit && (restoreImage == "" || checkpointBytes(restoreImage)+restoreMemoryMargin <= shown) {
				after.memory = *m.Limit
				booted := *m
				booted.Limit = &shown
				res.Memory = &booted
			}
		}
		if q, raise := restoreQuota(res.CPU); raise && restoreImage != "" {
			after.cpu = res.CPU
			booted := *res.CPU
			booted.Quota = &q
			res.CPU = &booted
		}
	}
	if b, err = json.Marshal(&spec); err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
	}
	if err != nil {
		return "", afterBoot{}, fmt.Errorf("write the container's boot bundle: %w: %w", err, errdefs.ErrUnavailable)
	}
	return dir, after, nil
}

// checkpointBytes is the size of the files of a checkpoint: the memory a
// restore loads (gVisor saves no page of zeros), and its kernel's state.
func checkpointBytes(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// apply writes what a's fields hold into the cgroups of the container
// whose sandbox process is pid. A sandbox process in no cgroup of a's name
// is in none runsc made (runsc did not manage its cgroups): no limit ever
// applied to it, and nothing is written.
func (a afterBoot) apply(pid int) error {
	if a.memory == 0 && a.cpu == nil {
		return nil
	}
	procCgroup, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Errorf("find the container's cgroup: %w: %w", err, errdefs.ErrUnavailable)
	}
	mounts, err := mountinfo.Read()
	if err != nil {
		return fmt.Errorf("find the container's cgroup: %w: %w", err, errdefs.ErrUnavailable)
	}
	set := func(controller, v1Name, v2Name string, value func(dir string, v1 bool) (string, error)) error {
		dir, v1, err := cgroupDir(string(procCgroup), mounts, a.cgroup, controller)
		if err != nil || dir == "" {
			return err
		}
		v, err := value(dir, v1)
		if err == nil {
			name := v2Name
			if v1 {
				name = v1Name
			}
			err = writeCgroupFile(filepath.Join(dir, name), v)
		}
		if err != nil {
			return fmt.Errorf("set the container's %s limit: %w: %w", controller, err, errdefs.ErrUnavailable)
		}
		return nil
	}
	if a.memory > 0 {
		err := set("memory", "memory.limit_in_bytes", "memory.max", func(string, bool) (string, error) {
			return strconv.FormatInt(a.memory, 10), nil
		})
		if err != nil {
			return err
		}
	}
	if a.cpu != nil {
		return set("cpu", "cpu.cfs_quota_us", "cpu.max", func(_ string, v1 bool) (string, error) {
			if v1 {
				return strconv.FormatInt(*a.cpu.Quota, 10), nil
			}
			return strconv.FormatInt(*a.cpu.Quota, 10) + " " + strconv.FormatUint(*a.cpu.Period, 10), nil
		})
	}
	return nil
}

// writeCgroupFile writes value into a cgroup's file, which must exist.
func writeCgroupFile(file, value string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0) // never a new file
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cgroupDir returns the directory of the cgroup of controller that a
// process whose /proc/PID/cgroup is procCgroup is in, if that cgroup is
// named cgroup (else ""), and whether it is cgroup v1's: the v1 hierarchy
// with that controller (a hybrid host's v2 line is not runsc's), else
// cgroup v2 alone. The directory is where mounts (this process's mount
// table) mounts that hierarchy's root, so that nested hosts (a hierarchy
// mounted from a cgroup of its own) work too; a path outside every such
// mount is an error.
func cgroupDir(procCgroup string, mounts []mountinfo.Mount, cgroup, controller string) (dir string, v1 bool, err error) {
	path := ""
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(line, ":", 3)
		switch {
		case len(f) != 3:
		case f[0] == "0":
			if !v1 {
				path = f[2]
			}
		case hasController(f[1], controller):
			path, v1 = f[2], true
		}
	}
	if path == "" || filepath.Base(path) != cgroup {
		return "", false, nil
	}
	for _, m := range mounts {
		if v1 && (m.Type != "cgroup" || !hasController(m.SuperOptions, controller)) || !v1 && m.Type != "cgroup2" {
			continue
		}
		rel, err := filepath.Rel(m.Root, path)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			continue
		}
		return filepath.Join(m.Point, rel), v1, nil
	}
	return "", false, fmt.Errorf("find the container's cgroup %s: no cgroup hierarchy mounted here holds it: %w", path, errdefs.ErrUnavailable)
}

// hasController reports whether a comma-separated list of cgroup
// controllers (or mount options) holds name.
func hasController(list, name string) bool { return slices.Contains(strings.Split(list, ","), name) }
