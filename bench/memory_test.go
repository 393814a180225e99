package bench

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestNamesBundle(t *testing.T) {
	const dir = "/var/lib/flmbox/sandboxes/a"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"runsc-sandbox", "--root=/r", "boot", "--bundle=" + dir, "id"}, true},
		{[]string{"runsc-gofer", "gofer", "--bundle", dir, "--spec-fd=3"}, true},
		{[]string{"runsc", "-bundle", dir}, true},
		{[]string{"runsc-sandbox", "boot", "--bundle=" + dir + "0"}, false},
		{[]string{"runsc-gofer", "gofer", "--bundle", dir + "/x"}, false},
		{[]string{"cat", "bundle", dir}, false},
		{[]string{"runsc", "--bundle"}, false},
	} {
		cmdline := []byte(strings.Join(tc.args, "\x00") + "\x00")
		if got := namesBundle(cmdline, dir); got != tc.want {
			t.Errorf("%q: got %t", tc.args, got)
		}
	}
}

// TestBundleProcesses finds a real process tree by its command line and
// reads its memory.
func TestBundleProcesses(t *testing.T) {
	bundle := filepath.Join(t.TempDir(), "bundle dir")
	// sh names the bundle (as runsc's processes do) and starts a child.
	cmd := exec.Command("sh", "-c", "sleep 30 & wait", "sh", "--bundle", bundle)
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
		pids, _ = bundleProcesses(bundle)
	}
	if len(pids) != 2 || pids[0] != cmd.Process.Pid {
		t.Fatalf("processes %v, want sh (%d) and its sleep", pids, cmd.Process.Pid)
	}
	m, err := processMemory(pids)
	if err != nil {
		t.Fatal(err)
	}
	if m.processes != 2 || m.rss <= 0 || m.pss <= 0 || m.pss > m.rss {
		t.Fatalf("memory %+v", m)
	}
	if _, err := bundleProcesses(bundle + "-none"); err == nil {
		t.Fatal("found processes of a bundle nobody runs")
	}
}
