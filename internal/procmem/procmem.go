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
	"strconv"
	"strings"
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
	seen := map[int]bool{}
	for i := 0; i < len(pids); i++ {
		seen[pids[i]] = true
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

// Of sums Rss and Pss of /proc/PID/smaps_rollup over pids; processes gone
// meanwhile are left out. It fails if all are gone.
func Of(pids []int) (Memory, error) {
	var m Memory
	for _, pid := range pids {
		f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue // exited meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[2] != "kB" {
				continue
			}
			n, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Rss:":
				m.RSS += n
			case "Pss:":
				m.PSS += n
			}
		}
		f.Close()
		m.Processes++
	}
	if m.Processes == 0 {
		return m, fmt.Errorf("measure memory: the processes are gone")
	}
	return m, nil
}
