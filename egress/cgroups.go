package egress

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupFS is where the host's cgroups are mounted.
const cgroupFS = "/sys/fs/cgroup"

// resolverCgroups is the cgroup (under each controller's hierarchy, with
// cgroup v1) that holds the resolvers' cgroups.
const resolverCgroups = "flmbox-resolvers"

// cgroupDirs are the directories of the cgroups named name: one under
// cgroup v2, memory's and pids' under v1; none if name is empty or the
// host has neither.
func cgroupDirs(name string) (dirs []string, v2 bool) {
	if name == "" || filepath.Base(name) != name || name == "." || name == ".." {
		return nil, false
	}
	if _, err := os.Stat(filepath.Join(cgroupFS, "cgroup.controllers")); err == nil {
		return []string{filepath.Join(cgroupFS, resolverCgroups, name)}, true
	}
	return []string{filepath.Join(cgroupFS, "memory", resolverCgroups, name), filepath.Join(cgroupFS, "pids", resolverCgroups, name)}, false
}

// makeCgroups makes the cgroups named name, bounded to resolverMemory and
// resolverPids, and returns their directories.
func makeCgroups(name string) ([]string, error) {
	dirs, v2 := cgroupDirs(name)
	if dirs == nil {
		return nil, nil
	}
	write := func(dir, file, value string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
			return fmt.Errorf("make the resolver's cgroup: %w", err)
		}
		return nil
	}
	if v2 {
		// Memory and pids must be enabled down to the resolver's cgroup.
		parent := filepath.Dir(dirs[0])
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return nil, fmt.Errorf("make the resolver's cgroup: %w", err)
		}
		for _, d := range []string{cgroupFS, parent} {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
			if f := strings.Fields(string(b)); !slices.Contains(f, "memory") || !slices.Contains(f, "pids") {
				if err := write(d, "cgroup.subtree_control", "+memory +pids"); err != nil {
					return nil, err
				}
			}
		}
		if err := os.Mkdir(dirs[0], 0o755); err != nil && !os.IsExist(err) {
			return nil, fmt.Errorf("make the resolver's cgroup: %w", err)
		}
		if err := write(dirs[0], "memory.max", strconv.Itoa(resolverMemory)); err != nil {
			return nil, err
		}
		write(dirs[0], "memory.swap.max", "0") // no swap: not every host has it
		return dirs, write(dirs[0], "pids.max", strconv.Itoa(resolverPids))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("make the resolver's cgroup: %w", err)
		}
	}
	if err := write(dirs[0], "memory.limit_in_bytes", strconv.Itoa(resolverMemory)); err != nil {
		return nil, err
	}
	return dirs, write(dirs[1], "pids.max", strconv.Itoa(resolverPids))
}

// joinCgroups moves process pid into the cgroups dirs.
func joinCgroups(dirs []string, pid int) error {
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("put the resolver in cgroup %s: %w", d, err)
		}
	}
	return nil
}

// cgroupProcs are the processes in the cgroup dir.
func cgroupProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil && pid > 1 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// cgroupBusyWait bounds how long removing a cgroup waits for its
// processes to leave it (a killed process leaves once reaped).
const cgroupBusyWait = 5 * time.Second

// killCgroups kills every process in the cgroups named name, and removes
// them once empty. None is not an error.
func killCgroups(name string) error {
	dirs, _ := cgroupDirs(name)
	deadline := time.Now().Add(cgroupBusyWait)
	var errs []error
	for _, d := range dirs {
		for {
			pids, err := cgroupProcs(d)
			if os.IsNotExist(err) {
				break
			}
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			err = unix.Rmdir(d)
			if err == nil || err == unix.ENOENT {
				break
			}
			if err != unix.EBUSY || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove the resolver's cgroup %s: %w (processes %v)", d, err, pids))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
