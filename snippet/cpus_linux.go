package snippet

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ShowCPUs gives every thread of the agent's process the affinity of its
// first Agent.CPUs CPUs, which every process it starts inherits: snippets
// see that many by sched_getaffinity (nproc, OpenBLAS's and loky's thread
// counts, Python's os.process_cpu_count). gVisor runs a task wherever it
// runs; the mask is what the task is shown, and costs nothing. With CPUs 0,
// or no fewer than the process has, it does nothing.
func (a *Agent) ShowCPUs() error {
	if a.CPUs <= 0 {
		return nil
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return fmt.Errorf("show %d CPUs: %w", a.CPUs, err)
	}
	if set.Count() <= a.CPUs {
		return nil
	}
	var shown unix.CPUSet
	for i := 0; shown.Count() < a.CPUs && i < len(set)*64; i++ {
		if set.IsSet(i) {
			shown.Set(i)
		}
	}
	// Every thread: a process forked by a thread takes that thread's mask,
	// and the Go runtime forks from any of them.
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("show %d CPUs: %w", a.CPUs, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &shown); err != nil && err != unix.ESRCH {
			return fmt.Errorf("show %d CPUs: %w", a.CPUs, err)
		}
	}
	return nil
}
