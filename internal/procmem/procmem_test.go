package procmem

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestContainer finds a real process tree by the ID that ends its command
// line, as runsc's boot and gofer processes name their container, and reads
// its memory.
func TestContainer(t *testing.T) {
	const id = "flmbox-procmem-test-0123456789ab"
	// sh's command line ends with the ID; it starts a child.
	cmd, pids := startTree(t, "sleep 30 & wait", id)
	if len(pids) != 2 || pids[0] != cmd.Process.Pid {
		t.Fatalf("processes %v, want sh (%d) and its sleep", pids, cmd.Process.Pid)
	}
	m, err := Of(pids)
	if err != nil {
		t.Fatal(err)
	}
	if m.Processes != 2 || m.RSS <= 0 || m.PSS <= 0 || m.PSS > m.RSS {
		t.Fatalf("memory %+v", m)
	}
	if pids, err := Container(id + "-none"); err != nil || len(pids) != 0 {
		t.Fatalf("found processes %v (%v) of a container nobody runs", pids, err)
	}
}

// TestOfCountsAnAddressSpaceOnce measures a process and one of its threads
// (a task sharing its address space, as systrap's stub threads do): their
// memory counts once; a child process has an address space of its own.
func TestOfCountsAnAddressSpaceOnce(t *testing.T) {
	self := os.Getpid()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var tid int
	for _, e := range tasks {
		if n, _ := strconv.Atoi(e.Name()); n != self {
			tid = n
		}
	}
	if tid == 0 {
		t.Fatal("the test process has no thread but its main one")
	}
	if !sameVM(self, tid) {
		t.Fatalf("kcmp says thread %d does not share process %d's address space", tid, self)
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	if sameVM(self, child.Process.Pid) {
		t.Fatal("kcmp says a child process shares the test's address space")
	}
	alone, err := Of([]int{self})
	if err != nil {
		t.Fatal(err)
	}
	both, err := Of([]int{self, tid})
	if err != nil {
		t.Fatal(err)
	}
	if both.Processes != 2 || both.RSS > alone.RSS*3/2 {
		t.Fatalf("a process and its thread: %+v; the process alone: %+v (want its memory once)", both, alone)
	}
}

// TestMatchingListsEachOnce: a matching process whose child matches too (a
// fork before its exec has its parent's command line) is listed once, and
// so is the child.
func TestMatchingListsEachOnce(t *testing.T) {
	const id = "flmbox-procmem-test-fork-0123456789"
	// sh and its subshell, a fork that never execs: both end with id.
	cmd, pids := startTree(t, "(while :; do sleep 1; done) & wait", id)
	seen := map[int]bool{}
	for _, p := range pids {
		if seen[p] {
			t.Fatalf("processes %v: %d twice", pids, p)
		}
		seen[p] = true
	}
	if len(pids) < 2 || pids[0] != cmd.Process.Pid {
		t.Fatalf("processes %v, want sh (%d) and its subshell", pids, cmd.Process.Pid)
	}
}

// startTree starts sh -c script with a command line ending in id, in a
// process group killed when the test ends, and polls Container(id) until it
// finds two processes (or 5 s pass).
func startTree(t *testing.T, script, id string) (*exec.Cmd, []int) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script, "sh", id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); len(pids) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		pids, _ = Container(id)
	}
	return cmd, pids
}
