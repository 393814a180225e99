package procmem

import (
	"os/exec"
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
	cmd := exec.Command("sh", "-c", "sleep 30 & wait", "sh", id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); len(pids) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		pids, _ = Container(id)
	}
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
