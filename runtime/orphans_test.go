package runtime

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestNamesRoot(t *testing.T) {
	const root = "/var/lib/flmbox/runsc"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"runsc-sandbox", "--root=" + root, "boot", "flmbox-1"}, true},
		{[]string{"runsc-gofer", "--network=none", "--root", root, "gofer", "flmbox-1"}, true},
		{[]string{"runsc-sandbox", "--root=" + root + "x", "boot", "flmbox-1"}, false},
		{[]string{"runsc-sandbox", "--root", "/other", "boot", "flmbox-1"}, false},
		{[]string{"runsc-sandbox", "--root"}, false},
	} {
		if got := namesRoot(tc.args, root); got != tc.want {
			t.Errorf("%q: %t, want %t", tc.args, got, tc.want)
		}
	}
}

// TestKillOrphans runs a process named as runsc's sandbox process of a
// container: KillOrphans leaves it while runsc's root has no file of that
// container (nothing runsc made can be left then) or a record names it, and
// kills it once the root has its lock file and no record names it.
func TestKillOrphans(t *testing.T) {
	root := t.TempDir()
	r, err := NewRuntime("/bin/true", root)
	if err != nil {
		t.Fatal(err)
	}
	const id = "flmbox-orphan"
	// A shell (argument 0: runsc-sandbox) that waits for its sleep.
	cmd := exec.Command("/bin/sh")
	cmd.Args = []string{"runsc-sandbox", "-c", "sleep 1000; exit 0", "--root=" + root, "boot", id}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited })
	for _, tc := range []struct {
		lock  string
		known []string
		kills bool
	}{
		{"", nil, false},
		{id + "_sandbox:" + id + ".lock", []string{id}, false},
		{id + "_sandbox:" + id + ".lock", nil, true},
	} {
		if tc.lock != "" {
			if err := os.WriteFile(filepath.Join(root, tc.lock), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		recorded := map[string]bool{}
		for _, id := range tc.known {
			recorded[id] = true
		}
		n, err := r.KillOrphans(recorded, func() []string { return tc.known })
		if err != nil || n != 0 && !tc.kills || n != 1 && tc.kills {
			t.Fatalf("lock file %q, known %q: killed %d, %v", tc.lock, tc.known, n, err)
		}
		select {
		case <-exited:
			if !tc.kills {
				t.Fatalf("lock file %q, known %q: the process was killed", tc.lock, tc.known)
			}
		case <-time.After(time.Duration(map[bool]int{true: 10, false: 0}[tc.kills]) * time.Second):
			if tc.kills {
				t.Fatal("the orphan process is alive 10s after KillOrphans")
			}
		}
	}
}
