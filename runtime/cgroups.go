package runtime

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
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
