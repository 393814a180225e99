package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/memcg"
	"golang.org/x/sys/unix"
)

// cgroupRoot is where runsc makes a container's cgroups: it does not read
// the mount table, and names them after the spec's cgroupsPath, "/" + the
// container's ID when the spec has none (flmbox's have none). So a
// container's cgroups are cgroupRoot/CONTROLLER/ID under cgroup v1 and
// cgroupRoot/ID under cgroup v2 alone.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupName is the name of the cgroups runsc makes for container id
// whose spec has cgroupsPath.
func cgroupName(cgroupsPath, id string) string {
	if cgroupsPath != "" {
		return filepath.Base(cgroupsPath)
	}
	return id
}

// cgroupBusyWait bounds how long removeCgroups retries a cgroup whose
// processes are still leaving it (runsc waits as long).
const cgroupBusyWait = 5 * time.Second

// removeCgroups removes the cgroups named name (cgroupName) of a
// container, which must have no process left. runsc removes the ones it
// made, but not those of a runsc killed while it made them, nor ones it
// found already there (a later runsc of the same ID, as a resume is, then
// keeps them for ever). Only empty directories are removed (rmdir); none
// is not an error.
func removeCgroups(name string) error {
	return removeCgroupsUnder(cgroupRoot, name, cgroupBusyWait)
}

func removeCgroupsUnder(root, id string, wait time.Duration) error {
	if id == "" || filepath.Base(id) != id || id == "." || id == ".." {
		return fmt.Errorf("remove the cgroups of container %q: not a container ID: %w", id, errdefs.ErrInvalidArgument)
	}
	paths, err := filepath.Glob(filepath.Join(root, "*", id))
	if err != nil {
		return err
	}
	paths = append(paths, filepath.Join(root, id))
	deadline := time.Now().Add(wait)
	var errs []error
	for _, p := range paths {
		for {
			err := unix.Rmdir(p)
			if err == unix.EBUSY && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err != nil && err != unix.ENOENT && err != unix.ENOTDIR {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", p, err))
			}
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove the cgroups of container %s: %w: %w", id, err, errdefs.ErrUnavailable)
	}
	return nil
}

// Memory is what a container's memory cgroup holds, in bytes.
type Memory struct {
	// Charged is all that is charged to it (cgroup v1's
	// memory.usage_in_bytes, v2's memory.current): its processes' memory
	// (gVisor's memory file too), page cache they read, kernel memory.
	Charged int64
	// InactiveFile is the part of Charged that is inactive file cache,
	// which the kernel reclaims first.
	InactiveFile int64
}

// ContainerMemory reads what the memory cgroup that runsc made for
// container id holds (see cgroupRoot): two small reads, where summing the
// PSS of its processes walks every mapping of each. errdefs.ErrNotFound if
// there is none.
func ContainerMemory(id string) (Memory, error) { return containerMemoryUnder(cgroupRoot, id) }

func containerMemoryUnder(root, id string) (Memory, error) {
	c, err := memcg.OpenUnder(root, id)
	if err != nil {
		return Memory{}, err
	}
	defer c.Close()
	charged, err := c.Read()
	if err != nil {
		return Memory{}, err
	}
	stat, _ := os.ReadFile(filepath.Join(c.Dir(), "memory.stat"))
	return Memory{Charged: charged, InactiveFile: min(statValue(stat, c.InactiveKey()), charged)}, nil
}

// statValue is key's value in a memory.stat file, 0 if it has none.
func statValue(stat []byte, key string) int64 {
	for _, line := range strings.Split(string(stat), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
