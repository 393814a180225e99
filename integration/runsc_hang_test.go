//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
)

// Every runsc command flmbox runs is bounded and interruptible:
// flmbox driven through a runsc that hangs on one command (a script that
// sleeps, so that no test depends on the host's KVM), and kvm refused on a
// host without a usable /dev/kvm.

// hangRunsc is a runsc that runs the real one, but sleeps (for ever, as far
// as a test goes) on the runsc command named in its hang file, and logs
// every command line it gets.
type hangRunsc struct {
	path, hangFile, calls string
	mark                  string // the sleep's argument, to find it
}

// hangRunscs numbers the fake runscs, so that each sleeps for a time of
// its own: its mark.
var hangRunscs atomic.Int64

func newHangRunsc(t *testing.T) *hangRunsc {
	t.Helper()
	dir := t.TempDir()
	h := &hangRunsc{path: filepath.Join(dir, "runsc"), hangFile: filepath.Join(dir, "hang"), calls: filepath.Join(dir, "calls"),
		mark: fmt.Sprintf("%d.%d", 3600+os.Getpid()%1000, 100+hangRunscs.Add(1))}
	script := fmt.Sprintf(`#!/bin/sh
echo "$*" >> %[1]s
hang=$(cat %[2]s 2>/dev/null)
if [ -n "$hang" ]; then
	case " $* " in
	*" $hang "*) sleep %[3]s; exit 1 ;;
	esac
fi
exec %[4]s "$@"
`, h.calls, h.hangFile, h.mark, runscPath)
	testprog.Write(t, h.path, []byte(script))
	return h
}

// hangOn makes the fake runsc hang on runsc command sub ("": on none).
func (h *hangRunsc) hangOn(t *testing.T, sub string) {
	t.Helper()
	if err := os.WriteFile(h.hangFile, []byte(sub), 0o600); err != nil {
		t.Fatal(err)
	}
}

// hanging reports whether a fake runsc is sleeping now.
func (h *hangRunsc) hanging() bool {
	for _, p := range h.processes() {
		if strings.Contains(p, "sleep "+h.mark) {
			return true
		}
	}
	return false
}

// processes lists the fake runsc's own processes: the script (until it
// execs the real runsc: the kernel runs it as "/bin/sh PATH ARGS...") and
// its sleep.
func (h *hangRunsc) processes() []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(args) >= 2 && args[1] == h.path || filepath.Base(args[0]) == "sleep" && len(args) == 2 && args[1] == h.mark {
			out = append(out, e.Name()+": "+strings.Join(args, " "))
		}
	}
	return out
}

// noneLeft fails the test if a fake runsc process is left (once killed
// ones are reaped).
func (h *hangRunsc) noneLeft(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(h.processes()) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("fake runsc processes left: %q", h.processes())
		}
	}
}

// start starts flmbox with the fake runsc; wait waits for it.
func (h *hangRunsc) start(t *testing.T, root string, args ...string) *hangCmd {
	t.Helper()
	cmd := exec.Command(flmboxBin, append([]string{"--root", root, "--runsc", h.path}, args...)...)
	c := &hangCmd{cmd: cmd, started: time.Now()}
	cmd.Stdout, cmd.Stderr = &c.stdout, &c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guard := time.AfterFunc(5*time.Minute, func() { cmd.Process.Kill() })
	t.Cleanup(func() { guard.Stop() })
	return c
}

type hangCmd struct {
	cmd            *exec.Cmd
	started        time.Time
	stdout, stderr bytes.Buffer
}

// wait returns how flmbox ended and how long it ran.
func (c *hangCmd) wait(t *testing.T) (result, time.Duration) {
	t.Helper()
	err := c.cmd.Wait()
	took := time.Since(c.started)
	res := result{stdout: c.stdout.String(), stderr: c.stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.code = 128 + int(ws.Signal())
		}
	case err != nil:
		t.Fatal(err)
	}
	return res, took
}

// run runs flmbox with the fake runsc to its end.
func (h *hangRunsc) run(t *testing.T, root string, args ...string) (result, time.Duration) {
	t.Helper()
	return h.start(t, root, args...).wait(t)
}

// firstLine is the first line of s: what flmbox says went wrong (a hint
// may follow).
func firstLine(s string) string { return strings.SplitN(s, "\n", 2)[0] }

// noSandboxes fails the test unless root has no sandbox and runsc no
// process of root's, once the real runsc's sandbox ls has reconciled it.
func noSandboxes(t *testing.T, root string) {
	t.Helper()
	if sbs := sandboxLs(t, root); len(sbs) != 0 {
		t.Errorf("sandbox ls: %+v, want none", sbs)
	}
	waitNoProcesses(t, stateroot.Runsc(root))
}

// TestRunscHang runs beside other tests: its bounds are well above what
// they test (25 s for runsc kill's 10 s, 6 s for a removal's 2 s grace),
// room for their load, and a fake runsc sleeps on a mark of its own.
func TestRunscHang(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	h := newHangRunsc(t)
	create := func(t *testing.T, name string) {
		t.Helper()
		h.hangOn(t, "")
		if res, _ := h.run(t, root, "sandbox", "create", "--name", name, "--image", reg.digestRef()); res.code != 0 {
			t.Fatalf("sandbox create: exit %d: %s", res.code, res.stderr)
		}
	}

	t.Run("rm gets past a runsc kill that hangs", func(t *testing.T) {
		create(t, "hang-kill")
		h.hangOn(t, "kill")
		res, took := h.run(t, root, "sandbox", "rm", "hang-kill")
		t.Logf("sandbox rm: %s, exit %d, %q", took.Round(time.Millisecond), res.code, res.stderr)
		if res.code != 0 {
			t.Errorf("sandbox rm: exit %d: %s", res.code, res.stderr)
		}
		if took > 25*time.Second { // runsc kill's bound is 10 s
			t.Errorf("sandbox rm took %s", took)
		}
		h.noneLeft(t)
		h.hangOn(t, "")
		noSandboxes(t, root)
	})

	t.Run("rm says which runsc command did not finish", func(t *testing.T) {
		create(t, "hang-delete")
		h.hangOn(t, "delete")
		res, took := h.run(t, root, "sandbox", "rm", "hang-delete")
		t.Logf("sandbox rm: %s, exit %d, %q", took.Round(time.Millisecond), res.code, res.stderr)
		if res.code == 0 || !strings.Contains(firstLine(res.stderr), "runsc delete did not finish in 20s") || strings.Contains(res.stderr, "goroutine") {
			t.Errorf("sandbox rm: exit %d, stderr %q; want a line that says runsc delete did not finish", res.code, res.stderr)
		}
		if took > 40*time.Second { // runsc delete's bound is 20 s
			t.Errorf("sandbox rm took %s", took)
		}
		h.noneLeft(t)
		h.hangOn(t, "")
		flmbox(t, root, "sandbox", "rm", "hang-delete") // if the first left its record
		noSandboxes(t, root)
	})

	// A removal goes on for 2 s after the signal (sandbox.Manager.destroy's
	// removeGrace), then the hung runsc is killed and the record stays
	// removing, for the next command's Reconcile to finish.
	t.Run("SIGTERM ends an rm whose runsc kill hangs", func(t *testing.T) {
		create(t, "hang-term")
		h.hangOn(t, "kill")
		c := h.start(t, root, "sandbox", "rm", "hang-term")
		pollUntil(t, 30*time.Second, "runsc kill to hang", h.hanging)
		sent := time.Now()
		c.cmd.Process.Signal(syscall.SIGTERM)
		res, _ := c.wait(t)
		took := time.Since(sent)
		t.Logf("after SIGTERM: %s, exit %d, %q", took.Round(time.Millisecond), res.code, res.stderr)
		if took > 6*time.Second {
			t.Errorf("flmbox ended %s after SIGTERM", took)
		}
		h.noneLeft(t)
		h.hangOn(t, "")
		noSandboxes(t, root) // what the interrupted rm left, sandbox ls removes
	})

	t.Run("SIGTERM ends a run --image whose runsc run hangs", func(t *testing.T) {
		h.hangOn(t, "run")
		c := h.start(t, root, "run", "--image", reg.digestRef(), "-c", "print(1)")
		pollUntil(t, 60*time.Second, "runsc run to hang", h.hanging)
		sent := time.Now()
		c.cmd.Process.Signal(syscall.SIGTERM)
		res, _ := c.wait(t)
		took := time.Since(sent)
		t.Logf("after SIGTERM: %s, exit %d, %q", took.Round(time.Millisecond), res.code, res.stderr)
		if took > 10*time.Second {
			t.Errorf("flmbox ended %s after SIGTERM", took)
		}
		if res.code == 0 {
			t.Errorf("an interrupted run exited 0")
		}
		h.noneLeft(t)
		h.hangOn(t, "")
		noSandboxes(t, root)
	})

	t.Run("sandbox ls of a healthy sandbox needs no runsc state", func(t *testing.T) {
		create(t, "hang-state")
		h.hangOn(t, "state")
		res, took := h.run(t, root, "sandbox", "ls", "--json")
		t.Logf("sandbox ls: %s, exit %d, %s %q", took.Round(time.Millisecond), res.code, res.stdout, res.stderr)
		if res.code != 0 || took > 15*time.Second { // runsc state's bound is 10 s, were it asked
			t.Errorf("sandbox ls: exit %d after %s: %s", res.code, took, res.stderr)
		}
		h.noneLeft(t)
		h.hangOn(t, "")
		mustFlmbox(t, root, "sandbox", "rm", "hang-state")
	})
}

// withoutKVM returns the command line that runs flmbox args in a mount
// namespace of its own where /dev/kvm is not KVM (/dev/null is bound over
// it), or flmbox args as they are if this host has no /dev/kvm.
func withoutKVM(t *testing.T, args ...string) []string {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return append([]string{flmboxBin}, args...)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("this host has /dev/kvm and no unshare to hide it")
	}
	return append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind /dev/null /dev/kvm && exec "$0" "$@"`, flmboxBin}, args...)
}

func TestKVMRefusedWithoutDevKVM(t *testing.T) {
	// Not parallel: it bounds how long commands take.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	h := newHangRunsc(t)
	run := func(args ...string) (result, time.Duration) {
		argv := withoutKVM(t, append([]string{"--root", root, "--runsc", h.path}, args...)...)
		cmd := exec.Command(argv[0], argv[1:]...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err := cmd.Run()
		res := result{stdout: stdout.String(), stderr: stderr.String()}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			res.code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return res, time.Since(start)
	}
	for _, args := range [][]string{
		{"run", "--image", reg.digestRef(), "--gvisor-platform", "kvm", "-c", "print(1)"},
		{"sandbox", "create", "--name", "kvm", "--image", reg.digestRef(), "--gvisor-platform", "kvm"},
	} {
		res, took := run(args...)
		t.Logf("%v: %s, exit %d, %q", args[:2], took.Round(time.Millisecond), res.code, res.stderr)
		if res.code != 125 || !strings.Contains(firstLine(res.stderr), "gVisor platform kvm cannot run on this host") ||
			!strings.Contains(firstLine(res.stderr), "systrap") || took > 10*time.Second {
			t.Errorf("%v: exit %d after %s, stderr %q; want 125 and a line that refuses kvm", args[:2], res.code, took, res.stderr)
		}
	}
	if b, _ := os.ReadFile(h.calls); bytes.Contains(b, []byte(" run ")) || bytes.Contains(b, []byte("--platform=kvm")) {
		t.Errorf("runsc ran for kvm:\n%s", b)
	}
	noSandboxes(t, root)

	res, _ := run("doctor", "--json")
	var checks []struct {
		Name      string
		Platforms []struct {
			Name      string
			Supported bool
			Reason    string
		}
	}
	if err := json.Unmarshal([]byte(res.stdout), &checks); err != nil {
		t.Fatalf("doctor --json: %v: %s", err, res.stdout)
	}
	found := false
	for _, ch := range checks {
		for _, p := range ch.Platforms {
			if p.Name == "kvm" {
				found = true
				if p.Supported || !strings.Contains(p.Reason, "/dev/kvm") {
					t.Errorf("doctor says of kvm: %+v", p)
				}
			}
		}
	}
	if !found {
		t.Errorf("doctor --json says nothing of kvm: %s", res.stdout)
	}
}
