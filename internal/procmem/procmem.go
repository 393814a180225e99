// Package procmem measures the host memory of a runsc container's
// processes: its sandbox (the sentry), its gofer and their children
// (systrap's stubs), found by the container ID that ends the command line
// of runsc's boot and gofer processes.
package procmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
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

// Container returns the pids of every host process of the runsc container
// id: those whose command line ends with id (runsc's sandbox and gofer
// processes) and all their descendants.
func Container(id string) ([]int, error) {
	return Matching(func(cmdline []string) bool { return len(cmdline) > 0 && cmdline[len(cmdline)-1] == id })
}

// Matching returns the pids of the host processes whose command line
// matches, and of all their descendants.
func Matching(match func(cmdline []string) bool) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parent(pid); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		if match(strings.Split(string(bytes.TrimSuffix(b, []byte{0})), "\x00")) {
			pids = append(pids, pid)
		}
	}
	// A matching process's child may match too (forked, not yet exec'd: it
	// has its parent's command line); each pid is listed once.
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
	return pids, nil
}

// parent returns the parent pid of pid.
func parent(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields after
	// the last ')' are state, ppid...
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[1])
}

// Of sums Rss and Pss of /proc/PID/smaps_rollup over pids, once per
// address space: systrap's stub threads are processes of their own that
// share one address space (clone with CLONE_VM, not CLONE_THREAD), and each
// of them shows that address space's whole memory. Processes gone meanwhile
// are left out. It fails if all are gone.
func Of(pids []int) (Memory, error) {
	var m Memory
	var counted []int // one pid per address space counted
	for _, pid := range pids {
		rss, pss, err := rollup(pid)
		if err != nil {
			continue // exited meanwhile
		}
		m.Processes++
		if slices.ContainsFunc(counted, func(c int) bool { return sameVM(pid, c) }) {
			continue
		}
		counted = append(counted, pid)
		m.RSS += rss
		m.PSS += pss
	}
	if m.Processes == 0 {
		return m, fmt.Errorf("measure memory: the processes are gone")
	}
	return m, nil
}

// rollup returns Rss and Pss of /proc/pid/smaps_rollup, in KiB.
func rollup(pid int) (rss, pss int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
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
	return rss, pss, sc.Err()
}

// kcmpVM is kcmp(2)'s KCMP_VM: do two processes share their address space?
const kcmpVM = 1

// sameVM reports whether processes a and b share one address space. Where
// kcmp(2) cannot tell (no kernel support, a process gone), they do not.
func sameVM(a, b int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	return errno == 0 && r == 0
}
