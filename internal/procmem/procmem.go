// Package procmem measures the host processes of runsc containers: their
// sandbox (the sentry), their gofer and their children (systrap's stubs),
// found by the container ID that ends the command line of runsc's boot and
// gofer processes; their memory (each address space once), tasks,
// descriptors (each table once) and CPU.
package procmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Memory is the memory of a set of host processes, in KiB.
type Memory struct {
	RSS, PSS  int64
	Processes int
}

// Usage is what a set of host processes use.
type Usage struct {
	Memory
	// Tasks are their threads; FDs their open descriptors, each
	// descriptor table once.
	Tasks, FDs int
	// Ticks is their CPU time (utime + stime, all their threads), in
	// USER_HZ ticks (UserHZ a second).
	Ticks uint64
}

// UserHZ is the unit of /proc/PID/stat's times.
const UserHZ = 100

// Container returns the pids of every host process of the runsc container
// id: those whose command line ends with id (runsc's sandbox and gofer
// processes) and all their descendants.
func Container(id string) ([]int, error) {
	by, err := Containers(map[string]bool{id: true})
	return by[id], err
}

// Containers returns, by container ID, the pids of every host process of
// the runsc containers ids, as Container does, in one walk of /proc.
func Containers(ids map[string]bool) (map[string][]int, error) { return containersIn("/proc", ids) }

func containersIn(proc string, ids map[string]bool) (map[string][]int, error) {
	return matchingIn(proc, func(cmdline []string) string {
		if id := cmdline[len(cmdline)-1]; ids[id] {
			return id
		}
		return ""
	})
}

// Matching returns the pids of the host processes whose command line
// matches, and of all their descendants.
func Matching(match func(cmdline []string) bool) ([]int, error) {
	by, err := matchingIn("/proc", func(cmdline []string) string {
		if match(cmdline) {
			return "match"
		}
		return ""
	})
	return by["match"], err
}

// matchingIn walks proc (/proc) once and returns, by the key that key gives
// a process's command line ("": none), the pids of the processes of each
// key and all their descendants, each once.
func matchingIn(proc string, key func(cmdline []string) string) (map[string][]int, error) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	by := map[string][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join(proc, e.Name())
		if b, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil {
			if ppid, _, err := ParseStat(b); err == nil {
				children[ppid] = append(children[ppid], pid)
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if k := key(strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")); k != "" {
			by[k] = append(by[k], pid)
		}
	}
	for k, pids := range by {
		// A matching process's child may match too (forked, not yet
		// exec'd: it has its parent's command line).
		seen := map[int]bool{}
		for _, p := range pids {
			seen[p] = true
		}
		for i := 0; i < len(pids); i++ {
			for _, c := range children[pids[i]] {
				if !seen[c] {
					seen[c] = true
					pids = append(pids, c)
				}
			}
		}
		by[k] = pids
	}
	return by, nil
}

// Of sums Rss and Pss of /proc/PID/smaps_rollup over pids, once per
// address space: systrap's stub threads are processes of their own that
// share one address space (clone with CLONE_VM, not CLONE_THREAD), and each
// of them shows that address space's whole memory. Processes gone meanwhile
// are left out. It fails if all are gone.
func Of(pids []int) (Memory, error) {
	u := Use(pids)
	if u.Processes == 0 {
		return u.Memory, fmt.Errorf("measure memory: the processes are gone")
	}
	return u.Memory, nil
}

// Use measures pids: their memory as Of does, their tasks, descriptors
// (each table once: systrap's stubs share the sentry's) and CPU. Processes
// gone meanwhile are left out.
func Use(pids []int) Usage { return useIn("/proc", pids) }

func useIn(proc string, pids []int) Usage {
	var u Usage
	var vms, tables []int // a pid per address space, per descriptor table
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		b, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		_, ticks, err := ParseStat(b)
		if err != nil {
			continue
		}
		u.Processes++
		u.Ticks += ticks
		if ts, err := os.ReadDir(filepath.Join(dir, "task")); err == nil {
			u.Tasks += len(ts)
		}
		if !slices.ContainsFunc(vms, func(o int) bool { return same(pid, o, kcmpVM) }) {
			vms = append(vms, pid)
			if b, err := os.ReadFile(filepath.Join(dir, "smaps_rollup")); err == nil {
				rss, pss := ParseRollup(b)
				u.RSS, u.PSS = u.RSS+rss, u.PSS+pss
			}
		}
		if !slices.ContainsFunc(tables, func(o int) bool { return same(pid, o, kcmpFiles) }) {
			tables = append(tables, pid)
			if fds, err := os.ReadDir(filepath.Join(dir, "fd")); err == nil {
				u.FDs += len(fds)
			}
		}
	}
	return u
}

// Ticks sums the CPU ticks of pids (gone ones count 0).
func Ticks(pids []int) uint64 { return ticksIn("/proc", pids) }

func ticksIn(proc string, pids []int) uint64 {
	var n uint64
	for _, pid := range pids {
		if b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat")); err == nil {
			if _, t, err := ParseStat(b); err == nil {
				n += t
			}
		}
	}
	return n
}

// ParseStat parses /proc/PID/stat: the parent pid and the process's CPU
// ticks (utime + stime, all its threads).
func ParseStat(b []byte) (ppid int, ticks uint64, err error) {
	// The command name, in parentheses, may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/PID/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is the state (field 3); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("parse /proc/PID/stat")
	}
	if ppid, err = strconv.Atoi(f[1]); err != nil {
		return 0, 0, err
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, err
	}
	return ppid, u + s, nil
}

// ParseRollup parses /proc/PID/smaps_rollup: Rss and Pss in KiB.
func ParseRollup(b []byte) (rss, pss int64) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			rss += n
		case "Pss:":
			pss += n
		}
	}
	return rss, pss
}

// kcmp(2)'s types: the same address space, the same descriptor table.
const (
	kcmpVM    = 1
	kcmpFiles = 2
)

// same reports whether processes a and b share what typ names. Where
// kcmp(2) cannot tell (no kernel support, a process gone), they do not.
func same(a, b, typ int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), uintptr(typ), 0, 0, 0)
	return errno == 0 && r == 0
}
