//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
)

// Suspend and resume (flmbox sandbox suspend, resume and gc) against the
// real runsc, through the flmbox CLI: what a suspended sandbox keeps (its
// /tmp, its pip installs, over a simulated reboot and over several cycles),
// what it costs (no host process), what is refused, what a killed suspend or
// resume leaves, a damaged image, and gc.

// suspendProcs lists the host processes whose command line names id, "PID
// cmdline" a line.
func suspendProcs(id string) string {
	var out strings.Builder
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		fmt.Fprintf(&out, "%d %s\n", pid, strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")))
	}
	return out.String()
}

// suspendNoProcesses fails the test unless, within 10 s (a killed process
// may wait a moment to be reaped), no host process names id: a suspended
// sandbox holds no memory.
func suspendNoProcesses(t *testing.T, id string) {
	t.Helper()
	var left string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if left = suspendProcs(id); left == "" {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Fatalf("host processes name the suspended sandbox's container %s:\n%s", id, left)
}

// suspendContainers lists the containers runsc knows under root.
func suspendContainers(t *testing.T, root string) []string {
	t.Helper()
	if _, err := os.Stat(stateroot.Runsc(root)); os.IsNotExist(err) {
		return nil
	}
	out, err := exec.Command(runscPath, "--root", stateroot.Runsc(root), "list", "-quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	return strings.Fields(string(out))
}

// suspendRunscCount counts the containers called id that runsc knows under
// root.
func suspendRunscCount(t *testing.T, root, id string) int {
	t.Helper()
	n := 0
	for _, c := range suspendContainers(t, root) {
		if c == id {
			n++
		}
	}
	return n
}

// suspendSandboxPID is the host pid of sandbox id's runsc-sandbox process.
func suspendSandboxPID(t *testing.T, root, id string) int {
	t.Helper()
	out, err := exec.Command(runscPath, "--root", stateroot.Runsc(root), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runsc state %s printed %s: %v", id, out, err)
	}
	return st.Pid
}

// suspendMust runs sandbox suspend NAME and checks that ls lists it
// suspended with an image and that no host process names it.
func suspendMust(t *testing.T, root, name string) *sandboxEntry {
	t.Helper()
	mustFlmbox(t, root, "sandbox", "suspend", name)
	sb := sandboxInfo(t, root, name)
	if sb == nil || sb.State != "suspended" || sb.ImageBytes <= 0 {
		t.Fatalf("sandbox ls after suspend: %+v, want suspended with an image", sb)
	}
	suspendNoProcesses(t, sb.ID)
	return sb
}

// suspendCPUQuota returns the CPU quota of container id's cgroup on the
// host, as its runsc-sandbox process's /proc/PID/cgroup names it:
// cpu.cfs_quota_us under cgroup v1, the quota of cpu.max under v2.
func suspendCPUQuota(t *testing.T, id string) string {
	t.Helper()
	var pid string
	for _, line := range strings.Split(suspendProcs(id), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasSuffix(f[1], "runsc-sandbox") {
			pid = f[0]
		}
	}
	if pid == "" {
		t.Fatalf("no runsc-sandbox process names %s:\n%s", id, suspendProcs(id))
	}
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[2] == "/" {
			continue
		}
		file := filepath.Join("/sys/fs/cgroup", f[2], "cpu.max")
		if slices.Contains(strings.Split(f[1], ","), "cpu") {
			file = filepath.Join("/sys/fs/cgroup/cpu", f[2], "cpu.cfs_quota_us")
		} else if f[0] != "0" {
			continue
		}
		q, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(q))[0]
	}
	t.Fatalf("no cgroup of its own with a cpu controller holds %s's sandbox:\n%s", id, b)
	return ""
}

// suspendManifest is the checksum of every file in the sandbox's /tmp,
// "SHA256  PATH" a line, sorted.
const suspendManifest = `find /tmp -type f -print0 | sort -z | xargs -0 sha256sum`

// suspendFill writes mib MiB of random bytes to /tmp/big in sandbox name.
func suspendFill(t *testing.T, root, name string, mib int) {
	t.Helper()
	mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c",
		fmt.Sprintf("head -c %d /dev/urandom > /tmp/big && mkdir -p /tmp/dir && echo kept > /tmp/dir/small", mib<<20))
}

// suspendCheck fails the test unless sandbox name answers a call and its
// /tmp holds what manifest (suspendManifest's output) says.
func suspendCheck(t *testing.T, root, name, manifest string) {
	t.Helper()
	if got := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", suspendManifest); got != manifest {
		t.Fatalf("/tmp of %s changed:\nbefore:\n%s\nafter:\n%s", name, manifest, got)
	}
}

// hookedRunsc writes a runsc wrapper and returns its path. It runs the
// tests' runsc, and appends the verb of each command (checkpoint, restore,
// kill, delete, ...) to $HOOK_LOG if set. With $HOOK_VERB and $HOOK_WHEN
// set, on that verb it touches $HOOK_MARK and then: "before" sleeps instead
// of running runsc, "during" runs runsc, "after" runs runsc and then sleeps;
// the test SIGKILLs flmbox's process group (the wrapper and runsc with it).
func hookedRunsc(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	script := `#!/bin/sh
verb=
for a in "$@"; do
	case $a in checkpoint|restore|run|create|start|state|kill|delete|list|wait) verb=$a; break;; esac
done
[ -n "$HOOK_LOG" ] && echo "$verb" >> "$HOOK_LOG"
hook=
[ -n "$HOOK_VERB" ] && [ "$verb" = "$HOOK_VERB" ] && hook=$HOOK_WHEN
case $hook in
before) touch "$HOOK_MARK"; exec sleep 600;;
during) touch "$HOOK_MARK";;
esac
` + runscPath + ` "$@"
rc=$?
if [ "$hook" = after ]; then touch "$HOOK_MARK"; exec sleep 600; fi
exit $rc
`
	testprog.Write(t, p, []byte(script))
	return p
}

// killPoint is where to SIGKILL a flmbox command: on runsc verb, when
// ("before", "during", "after"), and once until holds too, if not nil.
type killPoint struct {
	verb, when string
	until      func() bool
}

func (p killPoint) String() string { return p.when + " runsc " + p.verb }

// killAt runs flmbox args... with hookedRunsc, SIGKILLs its process group
// at p and reaps it. With an until, flmbox is stopped (SIGSTOP) when runsc
// reaches its verb, so that it is killed there. It returns false if flmbox
// ended before p was reached (a "during" point whose until never held).
func killAt(t *testing.T, root string, p killPoint, args ...string) (reached bool) {
	t.Helper()
	return killCmdAt(t, p, exec.Command(flmboxBin, append([]string{"--root", root, "--runsc", hookedRunsc(t)}, args...)...), args)
}

// killCmdAt is killAt of cmd, a flmbox command (args its arguments after
// --root and --runsc, which must be hookedRunsc's).
func killCmdAt(t *testing.T, p killPoint, cmd *exec.Cmd, args []string) (reached bool) {
	t.Helper()
	mark := filepath.Join(t.TempDir(), "mark")
	cmd.Env = append(os.Environ(), "HOOK_VERB="+p.verb, "HOOK_WHEN="+p.when, "HOOK_MARK="+mark)
	k := startKillable(t, cmd)
	stopped := false
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Millisecond) {
		_, err := os.Stat(mark)
		if err == nil && p.until != nil && !stopped {
			// flmbox is stopped (runsc, its child, runs on) until the
			// condition holds: however busy the host, flmbox cannot move
			// past the point before it is killed.
			syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP)
			stopped = true
		}
		if err == nil && (p.until == nil || p.until()) {
			k.kill()
			return true
		}
		select {
		case err := <-k.exited:
			k.killed = true
			if p.when == "during" {
				t.Logf("flmbox %v ended (%v) before the test saw it %s:\n%s", args, err, p, k.out.Bytes())
				return false
			}
			t.Fatalf("flmbox %v ended (%v) before it reached %s:\n%s", args, err, p, k.out.Bytes())
		default:
		}
		if time.Now().After(deadline) {
			k.kill()
			t.Fatalf("flmbox %v did not reach %s within 2m:\n%s", args, p, k.out.Bytes())
		}
	}
}

// TestSuspendDemo1Reboot: demo 1's first two calls, a suspend, a simulated
// reboot (no process of the sandbox left, runsc's state of it gone with
// the mounts) and a resume: the third call prints what it prints in a
// sandbox never suspended.
func TestSuspendDemo1Reboot(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	demo := func(name string, between func()) string {
		createSandbox(t, root, reg, name)
		mustFlmbox(t, root, "run", "--sandbox", name, "--language", "shell", "-c",
			`mkdir -p /tmp/demo && printf 'region,revenue,cost\neast,120,75\nwest,80,55\neast,150,90\nwest,100,70\n' > /tmp/demo/sales.csv`)
		if out := mustFlmbox(t, root, "run", "--sandbox", name, "../demo/demo1.py"); out != "{\"rows\": 4, \"revenue\": 450, \"profit\": 160}\nLinux\n" {
			t.Fatalf("demo1.py in %s printed %q", name, out)
		}
		between()
		return mustFlmbox(t, root, "run", "--sandbox", name, "--language", "shell", "-c", "cat /tmp/demo/summary.json; echo")
	}
	// What the third call prints in a sandbox never suspended.
	const want = "{\"rows\": 4, \"revenue\": 450, \"profit\": 160}\n"
	got := demo("demo", func() {
		sb := suspendMust(t, root, "demo")
		// The reboot: no process of the sandbox (asserted above; none is
		// killed), and what lived in memory or in runsc's state goes:
		// runsc's null-netns mount and its root.
		if ids := suspendContainers(t, root); len(ids) != 0 {
			t.Errorf("runsc still knows containers of the suspended sandbox: %q", ids)
		}
		if err := unix.Unmount(filepath.Join(stateroot.Runsc(root), "null-netns"), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			t.Fatal(err)
		}
		if err := os.RemoveAll(stateroot.Runsc(root)); err != nil {
			t.Fatal(err)
		}
		if mounts := flmboxMounts(t, root); len(mounts) != 0 {
			t.Fatalf("mounts under the root of a suspended sandbox: %q", mounts)
		}
		if st := sandboxState(t, root, "demo"); st != "suspended" {
			t.Fatalf("after the reboot sandbox ls says %q", st)
		}
		if res := flmbox(t, root, "sandbox", "resume", "demo"); res.code != 0 || res.stdout != "" {
			t.Fatalf("resume after the reboot: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
		}
		if st := sandboxState(t, root, "demo"); st != "running" {
			t.Fatalf("after resume sandbox ls says %q", st)
		}
		if n := suspendRunscCount(t, root, sb.ID); n != 1 {
			t.Fatalf("runsc knows %d containers %s after resume", n, sb.ID)
		}
	})
	if got != want {
		t.Fatalf("the third call after suspend, reboot and resume printed %q, without suspending %q", got, want)
	}
}

// TestSuspendCyclesKeepFiles: a 50 MiB file and a module pip installed in
// the user site under /tmp survive three suspend/resume cycles (E2B lost files
// after the second), the last one with the wheel removed from the cache
// meanwhile; every file of /tmp keeps its checksum. While
// suspended, the sandbox has an image of at least its /tmp and no host
// process names its container: it holds no memory.
func TestSuspendCyclesKeepFiles(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "cycles"
	mustFlmbox(t, root, "pipcache", "add", writeTestWheel(t, t.TempDir(), "flmbox-susp", "1.0"))
	createSandbox(t, root, reg, name)
	if out := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "python3 -m pip install flmbox-susp"); !strings.Contains(out, "Successfully installed flmbox-susp-1.0") {
		t.Fatalf("pip install printed %q", out)
	}
	const importIt = "import flmbox_susp; print(flmbox_susp.GREETING)"
	if out := mustFlmbox(t, root, "run", "--sandbox", name, "-c", importIt); out != "hello from flmbox-susp 1.0\n" {
		t.Fatalf("import before suspending printed %q", out)
	}
	suspendFill(t, root, name, 50)
	manifest := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", suspendManifest)
	for _, f := range []string{"/tmp/big", "/tmp/dir/small", "/tmp/.local/lib/python3.11/site-packages/flmbox_susp/__init__.py"} {
		if !strings.Contains(manifest, "  "+f+"\n") {
			t.Fatalf("the manifest of /tmp lacks %s:\n%s", f, manifest)
		}
	}
	for cycle := 1; cycle <= 3; cycle++ {
		if cycle == 2 {
			// What a resume killed after it recorded the sandbox running
			// leaves: its whole image. The next suspend makes a new one.
			if err := os.MkdirAll(filepath.Join(stateroot.Sandbox(root, name), "checkpoint"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(stateroot.Sandbox(root, name), "checkpoint", "pages.img"), []byte("stale"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		sb := suspendMust(t, root, name)
		if sb.ImageBytes < 50<<20 {
			t.Fatalf("cycle %d: the image holds %d bytes, less than /tmp's 50 MiB file", cycle, sb.ImageBytes)
		}
		// A resume removes its image in the background; what a process that
		// exited first left of it is gone once the sandbox is suspended again.
		if _, err := os.Stat(filepath.Join(stateroot.Sandbox(root, name), "checkpoint.old")); !os.IsNotExist(err) {
			t.Errorf("cycle %d: the previous image is left after a suspend: %v", cycle, err)
		}
		if cycle == 3 {
			// The wheel pip installed from leaves the cache while the
			// sandbox is suspended: the sandbox had opened it through its
			// wheels mount, and resumes without it.
			mustFlmbox(t, root, "pipcache", "rm", "flmbox-susp")
		}
		mustFlmbox(t, root, "sandbox", "resume", name)
		// runsc restored it under a raised quota: its own (--cpus 1) is back.
		if q := suspendCPUQuota(t, sb.ID); q != "100000" {
			t.Errorf("cycle %d: the resumed sandbox's CPU quota is %s µs per 100 ms, want its own 100000", cycle, q)
		}
		suspendCheck(t, root, name, manifest)
		if out := mustFlmbox(t, root, "run", "--sandbox", name, "-c", importIt); out != "hello from flmbox-susp 1.0\n" {
			t.Fatalf("cycle %d: import printed %q", cycle, out)
		}
		if cycle == 3 {
			if out := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "ls /dev/.flmbox/wheels"); strings.Contains(out, "flmbox_susp") {
				t.Fatalf("the resumed sandbox still lists the removed wheel: %q", out)
			}
		}
		// sandbox resume waits for the image's removal (Manager.Wait).
		for _, img := range []string{"checkpoint", "checkpoint.old"} {
			if _, err := os.Stat(filepath.Join(stateroot.Sandbox(root, name), img)); !os.IsNotExist(err) {
				t.Errorf("cycle %d: %s is left after resume: %v", cycle, img, err)
			}
		}
	}
}

// TestSuspendRefusedDuringACall: a sandbox running a call is not
// suspended (exit 125, saying why); it keeps running, takes other calls,
// the call completes, and then it suspends.
func TestSuspendRefusedDuringACall(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "busy"
	createSandbox(t, root, reg, name)
	call := exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "run", "--sandbox", name, "-c",
		`import pathlib, time
pathlib.Path("/tmp/started").touch()
while not pathlib.Path("/tmp/go").exists():
    time.sleep(0.02)
print("done")`)
	var out, errOut strings.Builder
	call.Stdout, call.Stderr = &out, &errOut
	if err := call.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- call.Wait() }()
	ended := false
	defer func() {
		if !ended {
			call.Process.Kill()
			<-done
		}
	}()
	pollUntil(t, time.Minute, "the background call to start", func() bool {
		return flmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "test -e /tmp/started").code == 0
	})
	res := flmbox(t, root, "sandbox", "suspend", name)
	if res.code != 125 || !strings.Contains(res.stderr, fmt.Sprintf("suspend sandbox %q", name)) || !strings.Contains(res.stderr, "calls are running") {
		t.Fatalf("suspend during a call: exit %d\nstdout: %s\nstderr: %s\nwant 125 and that calls are running", res.code, res.stdout, res.stderr)
	}
	if st := sandboxState(t, root, name); st != "running" {
		t.Fatalf("after the refused suspend sandbox ls says %q", st)
	}
	select {
	case err := <-done:
		ended = true
		t.Fatalf("the background call ended before the test's next call: %v\n%s%s", err, out.String(), errOut.String())
	default:
	}
	checkAlive(t, root, name)
	runIn(t, root, name, "touch /tmp/go", "-l", "shell")
	select {
	case err := <-done:
		ended = true
		if err != nil || out.String() != "done\n" {
			t.Fatalf("the background call: %v stdout %q stderr %q", err, out.String(), errOut.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the background call did not end within 2m")
	}
	suspendMust(t, root, name)
}

// TestSuspendDeadSandbox: a sandbox whose gVisor sandbox was killed from the
// host is not suspended: suspend fails saying it is dead, and writes no
// image.
func TestSuspendDeadSandbox(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "victim"
	createSandbox(t, root, reg, name)
	id := sandboxID(t, root, name)
	if err := syscall.Kill(suspendSandboxPID(t, root, id), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "sandbox ls to say the sandbox is dead", func() bool { return sandboxState(t, root, name) == "dead" })
	res := flmbox(t, root, "sandbox", "suspend", name)
	if res.code != 125 || !strings.Contains(res.stderr, fmt.Sprintf("suspend sandbox %q", name)) || !strings.Contains(res.stderr, "dead") {
		t.Fatalf("suspend of a dead sandbox: exit %d\nstdout: %s\nstderr: %s\nwant 125 and that it is dead", res.code, res.stdout, res.stderr)
	}
	t.Logf("suspend said: %s", strings.TrimSpace(res.stderr))
	if st := sandboxState(t, root, name); st != "dead" {
		t.Fatalf("after suspending a dead sandbox sandbox ls says %q", st)
	}
	for _, d := range []string{"checkpoint", "checkpoint.tmp"} {
		if _, err := os.Stat(filepath.Join(stateroot.Sandbox(root, name), d)); !os.IsNotExist(err) {
			t.Errorf("%s of a dead sandbox: %v", d, err)
		}
	}
	mustFlmbox(t, root, "sandbox", "rm", name)
}

// TestResumeTwiceAndConcurrent: resuming a running sandbox does nothing and
// exits 0; two resumes at once both exit 0 and restore it once: one runsc
// restore, one container, and a file written by a call after them is seen
// by the next.
func TestResumeTwiceAndConcurrent(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "twice"
	createSandbox(t, root, reg, name)
	suspendFill(t, root, name, 8)
	manifest := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", suspendManifest)
	log := filepath.Join(t.TempDir(), "runsc.log")
	runsc := hookedRunsc(t)
	resume := func() result {
		cmd := exec.Command(flmboxBin, "--root", root, "--runsc", runsc, "sandbox", "resume", name)
		cmd.Env = append(os.Environ(), "HOOK_LOG="+log)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		res := result{stdout: stdout.String(), stderr: stderr.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			res.code = ee.ExitCode()
		} else if err != nil {
			t.Errorf("run flmbox sandbox resume: %v", err)
			res.code = -1
		}
		return res
	}
	restores := func() int {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "restore\n")
	}

	t.Run("twice", func(t *testing.T) {
		suspendMust(t, root, name)
		for i := 1; i <= 2; i++ {
			if res := resume(); res.code != 0 || res.stdout != "" || res.stderr != "" {
				t.Fatalf("resume %d: exit %d\nstdout: %s\nstderr: %s", i, res.code, res.stdout, res.stderr)
			}
			if n := restores(); n != 1 {
				t.Fatalf("after resume %d runsc restored %d times, want 1", i, n)
			}
		}
		suspendCheck(t, root, name, manifest)
	})

	t.Run("concurrent", func(t *testing.T) {
		os.Remove(log)
		sb := suspendMust(t, root, name)
		var wg sync.WaitGroup
		var results [2]result
		for i := range results {
			wg.Add(1)
			go func() { defer wg.Done(); results[i] = resume() }()
		}
		wg.Wait()
		for i, res := range results {
			if res.code != 0 {
				t.Errorf("concurrent resume %d: exit %d\nstdout: %s\nstderr: %s", i, res.code, res.stdout, res.stderr)
			}
		}
		if n := restores(); n != 1 {
			b, _ := os.ReadFile(log)
			t.Fatalf("two concurrent resumes ran runsc restore %d times, want 1; runsc verbs:\n%s", n, b)
		}
		if st := sandboxState(t, root, name); st != "running" {
			t.Fatalf("after two resumes sandbox ls says %q", st)
		}
		if n := suspendRunscCount(t, root, sb.ID); n != 1 {
			t.Fatalf("runsc knows %d containers %s, want 1", n, sb.ID)
		}
		if n := strings.Count(suspendProcs(sb.ID), "runsc-sandbox"); n != 1 {
			t.Fatalf("%d runsc-sandbox processes name %s, want 1:\n%s", n, sb.ID, suspendProcs(sb.ID))
		}
		mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "echo after > /tmp/after")
		if out := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "cat /tmp/after; rm /tmp/after"); out != "after\n" {
			t.Fatalf("a file written after the resumes reads %q", out)
		}
		suspendCheck(t, root, name, manifest)
	})
}

// TestResumeOnRun: run --sandbox on a suspended sandbox resumes it first and
// says so: a note on stderr, or "resumed": true in its JSON; a call to a
// running sandbox says nothing of the kind.
func TestResumeOnRun(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "onrun"
	createSandbox(t, root, reg, name)
	mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "echo kept > /tmp/kept")

	suspendMust(t, root, name)
	res := flmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", "cat /tmp/kept")
	if res.code != 0 || res.stdout != "kept\n" || res.stderr != "flmbox: resumed sandbox "+name+"\n" {
		t.Fatalf("run on a suspended sandbox: exit %d\nstdout: %q\nstderr: %q", res.code, res.stdout, res.stderr)
	}
	if st := sandboxState(t, root, name); st != "running" {
		t.Fatalf("after run sandbox ls says %q", st)
	}

	// runJSON runs cat /tmp/kept with --json and returns its object.
	runJSON := func() map[string]any {
		t.Helper()
		res := flmbox(t, root, "run", "--sandbox", name, "--json", "-l", "shell", "-c", "cat /tmp/kept")
		var obj map[string]any
		if res.code != 0 || res.stderr != "" || json.Unmarshal([]byte(res.stdout), &obj) != nil || obj["stdout"] != "kept\n" {
			t.Fatalf("run --json: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
		}
		return obj
	}
	if obj := runJSON(); obj["resumed"] != nil && obj["resumed"] != false {
		t.Fatalf("run --json on a running sandbox says resumed: %v", obj)
	}
	suspendMust(t, root, name)
	if obj := runJSON(); obj["resumed"] != true {
		t.Fatalf("run --json on a suspended sandbox: %v, want \"resumed\": true", obj)
	}
	if st := sandboxState(t, root, name); st != "running" {
		t.Fatalf("after run --json sandbox ls says %q", st)
	}
}

// TestSuspendedRemove: sandbox rm removes a suspended sandbox, its image
// and its directory, and leaves no container, lease or process.
func TestSuspendedRemove(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "gone"
	createSandbox(t, root, reg, name)
	suspendFill(t, root, name, 8)
	sb := suspendMust(t, root, name)
	mustFlmbox(t, root, "sandbox", "rm", name)
	if _, err := os.Lstat(stateroot.Sandbox(root, name)); !os.IsNotExist(err) {
		t.Fatalf("the directory of a removed suspended sandbox: %v", err)
	}
	if st := sandboxState(t, root, name); st != "" {
		t.Fatalf("sandbox ls lists the removed sandbox as %q", st)
	}
	if ls := leases(t, root); len(ls) != 0 {
		t.Errorf("image leases left: %+v", ls)
	}
	if n := suspendRunscCount(t, root, sb.ID); n != 0 {
		t.Errorf("runsc knows the removed sandbox's container %s", sb.ID)
	}
	if left := suspendProcs(sb.ID); left != "" {
		t.Errorf("processes name the removed sandbox's container:\n%s", left)
	}
	res := flmbox(t, root, "sandbox", "resume", name)
	if res.code == 0 || !strings.Contains(res.stderr, fmt.Sprintf("no sandbox %q", name)) {
		t.Errorf("resume of a removed sandbox: exit %d %q", res.code, res.stderr)
	}
}

// suspendKill is a point at which to SIGKILL flmbox sandbox suspend, and
// the state sandbox ls then lists.
type suspendKill struct {
	point killPoint
	want  string
}

// suspendKilled SIGKILLs flmbox sandbox suspend at each point in turn, in
// one sandbox with 50 MiB in /tmp, and checks that the next sandbox ls
// (which reconciles) lists the sandbox as the point wants: never lost, dead
// or half done. The sandbox then answers the next call (after a resume if
// suspended) with its /tmp intact, and the next point's suspend starts
// from there; after the last, it suspends and resumes whole.
func suspendKilled(t *testing.T, kills []suspendKill) {
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "killed"
	createSandbox(t, root, reg, name)
	suspendFill(t, root, name, 50)
	manifest := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", suspendManifest)
	id := sandboxID(t, root, name)
	for _, tc := range kills {
		ok := t.Run(tc.point.String(), func(t *testing.T) {
			p := tc.point
			if p.when == "during" {
				// Midway: the image has begun.
				p.until = func() bool {
					fi, err := os.Stat(filepath.Join(stateroot.Sandbox(root, name), "checkpoint.tmp", "pages.img"))
					return err == nil && fi.Size() > 0
				}
			}
			if !killAt(t, root, p, "sandbox", "suspend", name) {
				tc.want = "suspended"
			}
			sb := sandboxInfo(t, root, name)
			if sb == nil || sb.State != tc.want {
				t.Errorf("sandbox ls after the kill lists %+v, want %s", sb, tc.want)
			}
			if _, err := os.Stat(filepath.Join(stateroot.Sandbox(root, name), "checkpoint.tmp")); !os.IsNotExist(err) {
				t.Errorf("checkpoint.tmp is left after the reconcile: %v", err)
			}
			if sb != nil && sb.State == "suspended" {
				suspendNoProcesses(t, id)
				mustFlmbox(t, root, "sandbox", "resume", name)
			}
			// Listed running (or resumed), it answers the next call. If it
			// does not, wait for it (90 s: the agent's own timeout after a
			// suspend request is a minute) to tell a late sandbox from a
			// lost one.
			if res := runIn(t, root, name, "print('alive')"); res.code != 0 {
				t.Errorf("the sandbox does not answer after the kill: exit %d %q", res.code, res.stderr)
				start := time.Now()
				pollUntil(t, 90*time.Second, "the sandbox to answer", func() bool { return runIn(t, root, name, "print('alive')").code == 0 })
				t.Logf("it answered %s later", time.Since(start).Round(time.Second))
			}
			suspendCheck(t, root, name, manifest)
			if n := suspendRunscCount(t, root, id); n != 1 {
				t.Errorf("runsc knows %d containers %s, want 1", n, id)
			}
		})
		if !ok {
			return
		}
	}
	suspendMust(t, root, name)
	mustFlmbox(t, root, "sandbox", "resume", name)
	suspendCheck(t, root, name, manifest)
}

// TestSuspendKilledWithItsImage: flmbox sandbox suspend SIGKILLed once the
// checkpoint image is written: the sandbox is running (the image was not
// yet renamed) or suspended (it was).
func TestSuspendKilledWithItsImage(t *testing.T) {
	t.Parallel()
	suspendKilled(t, []suspendKill{
		// The image is whole in checkpoint.tmp, not yet renamed.
		{killPoint{verb: "checkpoint", when: "after"}, "running"},
		// The image is renamed: suspended, the sandbox not yet deleted.
		{killPoint{verb: "kill", when: "before"}, "suspended"},
		// The container is deleted, its run directory still mounted.
		{killPoint{verb: "delete", when: "after"}, "suspended"},
	})
}

// TestSuspendKilledBeforeItsImage: flmbox sandbox suspend SIGKILLed after
// the agent closed its listener for the checkpoint, before the image is
// whole: the sandbox must be listed running and answer calls (the
// reconcile tells the agent to listen again).
func TestSuspendKilledBeforeItsImage(t *testing.T) {
	t.Parallel()
	suspendKilled(t, []suspendKill{
		// The agent closed its listener; no image yet.
		{killPoint{verb: "checkpoint", when: "before"}, "running"},
		// runsc is writing the image.
		{killPoint{verb: "checkpoint", when: "during"}, "running"},
	})
}

// TestResumeKilled: flmbox sandbox resume SIGKILLed midway leaves a
// sandbox that the next sandbox ls lists suspended, its image kept and
// nothing of the restore left running (no process, no host cgroup); it
// then resumes with /tmp intact. One sandbox meets each point in turn;
// its removal at the end leaves no cgroup either.
func TestResumeKilled(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "killed"
	createSandbox(t, root, reg, name)
	suspendFill(t, root, name, 20)
	manifest := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", suspendManifest)
	ids := map[string]bool{}
	for _, p := range []killPoint{
		{verb: "restore", when: "before"}, // the run directory mounted, the bundle re-pointed
		{verb: "restore", when: "during"}, // runsc restore running
		{verb: "restore", when: "after"},  // restored, the agent not yet awaited
	} {
		ok := t.Run(p.String(), func(t *testing.T) {
			id := suspendMust(t, root, name).ID
			ids[id] = true
			if p.when == "during" {
				// Midway: runsc's sandbox process is restoring.
				p.until = func() bool { return strings.Contains(suspendProcs(id), "runsc-sandbox") }
			}
			want := "suspended"
			if !killAt(t, root, p, "sandbox", "resume", name) {
				want = "running"
			}
			sb := sandboxInfo(t, root, name)
			if sb == nil || sb.State != want {
				t.Fatalf("sandbox ls after the kill lists %+v, want %s", sb, want)
			}
			if want == "suspended" {
				if _, err := os.Stat(filepath.Join(stateroot.Sandbox(root, name), "checkpoint", "checkpoint.img")); err != nil {
					t.Fatalf("the image after a killed resume: %v", err)
				}
				suspendNoProcesses(t, id)
				if n := suspendRunscCount(t, root, id); n != 0 {
					t.Fatalf("runsc knows the suspended sandbox's container %s", id)
				}
				noCgroups(t, id)
				mustFlmbox(t, root, "sandbox", "resume", name)
			}
			suspendCheck(t, root, name, manifest)
		})
		if !ok {
			return
		}
	}
	mustFlmbox(t, root, "sandbox", "rm", name)
	// A resume killed while runsc made its cgroups left them, and the next
	// runsc found them made and never removed them.
	for id := range ids {
		noCgroups(t, id)
	}
}

// TestResumeDamagedImage: a resume from a damaged image fails (exit 125,
// saying the sandbox stays suspended), keeps the image, leaves the sandbox
// suspended and nothing running for it; with the image put back, it
// resumes with its /tmp.
func TestResumeDamagedImage(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "damaged"
	createSandbox(t, root, reg, name)
	suspendFill(t, root, name, 8)
	manifest := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", suspendManifest)
	id := suspendMust(t, root, name).ID
	img := filepath.Join(stateroot.Sandbox(root, name), "checkpoint")
	backup := filepath.Join(t.TempDir(), "checkpoint")
	if out, err := exec.Command("cp", "-a", img, backup).CombinedOutput(); err != nil {
		t.Fatalf("copy the image: %v: %s", err, out)
	}
	putBack := func() {
		t.Helper()
		if err := os.RemoveAll(img); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", backup, img).CombinedOutput(); err != nil {
			t.Fatalf("put the image back: %v: %s", err, out)
		}
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T)
	}{
		{"checkpoint.img truncated", func(t *testing.T) {
			p := filepath.Join(img, "checkpoint.img")
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"pages.img removed", func(t *testing.T) {
			if err := os.Remove(filepath.Join(img, "pages.img")); err != nil {
				t.Fatal(err)
			}
		}},
		{"checkpoint.img removed", func(t *testing.T) {
			if err := os.Remove(filepath.Join(img, "checkpoint.img")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			putBack()
			tc.damage(t)
			// Said as damaged (gVisor could not read the image: no resume
			// will bring it back) or as a failed resume; either way the
			// sandbox stays suspended with its image.
			said := func(stderr string) bool {
				return strings.Contains(stderr, fmt.Sprintf("resume sandbox %q (it stays suspended, its image kept)", name)) ||
					strings.Contains(stderr, fmt.Sprintf("restore sandbox %q: its checkpoint is damaged (", name)) && strings.Count(strings.TrimSpace(stderr), "\n") == 1
			}
			res := flmbox(t, root, "sandbox", "resume", name)
			if res.code != 125 || !said(res.stderr) {
				t.Fatalf("resume of a damaged image: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
			}
			t.Logf("resume said: %s", strings.TrimSpace(res.stderr))
			if st := sandboxState(t, root, name); st != "suspended" {
				t.Fatalf("after a failed resume sandbox ls says %q", st)
			}
			if _, err := os.Stat(img); err != nil {
				t.Fatalf("the image after a failed resume: %v", err)
			}
			suspendNoProcesses(t, id)
			if n := suspendRunscCount(t, root, id); n != 0 {
				t.Fatalf("runsc knows the suspended sandbox's container %s after a failed resume", id)
			}
			if mounts := flmboxMounts(t, stateroot.Sandbox(root, name)); len(mounts) != 0 {
				t.Fatalf("mounts left under the sandbox after a failed resume: %q", mounts)
			}
			res = flmbox(t, root, "run", "--sandbox", name, "-c", "print(1)")
			if res.code != 125 || !said(res.stderr) && !strings.Contains(res.stderr, "it stays suspended") {
				t.Fatalf("run on a sandbox whose image is damaged: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
			}
		})
	}
	putBack()
	mustFlmbox(t, root, "sandbox", "resume", name)
	suspendCheck(t, root, name, manifest)
}

// TestSandboxGC: gc --dry-run says what it would do and changes nothing;
// --suspend-idle suspends running sandboxes idle for longer, and none idle
// for less; --remove-idle removes sandboxes idle for longer, suspended or
// running.
func TestSandboxGC(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "idle")
	mustFlmbox(t, root, "run", "--sandbox", "idle", "-l", "shell", "-c", "echo kept > /tmp/kept")
	createSandbox(t, root, reg, "other")
	// idleFor waits until sandbox ls says that every sandbox was last used
	// more than d ago.
	idleFor := func(d time.Duration) {
		t.Helper()
		pollUntil(t, time.Minute, "the sandboxes to be idle for "+d.String(), func() bool {
			var sbs []sandboxEntry
			if err := json.Unmarshal([]byte(mustFlmbox(t, root, "sandbox", "ls", "--json")), &sbs); err != nil {
				t.Fatal(err)
			}
			for _, sb := range sbs {
				if time.Since(sb.LastUsed) <= d {
					return false
				}
			}
			return true
		})
	}
	states := func() string {
		t.Helper()
		s := sandboxNames(t, root)
		return fmt.Sprintf("idle=%s other=%s", s["idle"], s["other"])
	}
	idleFor(time.Second)

	if out := mustFlmbox(t, root, "sandbox", "gc", "--suspend-idle", "1h"); out != "" {
		t.Fatalf("gc --suspend-idle 1h printed %q", out)
	}
	out := mustFlmbox(t, root, "sandbox", "gc", "--dry-run", "--suspend-idle", "1s")
	if !strings.Contains(out, "would suspend idle (idle ") || !strings.Contains(out, "would suspend other (idle ") {
		t.Fatalf("gc --dry-run --suspend-idle printed %q", out)
	}
	if got := states(); got != "idle=running other=running" {
		t.Fatalf("after gc --dry-run: %s", got)
	}

	idleID := sandboxID(t, root, "idle")
	out = mustFlmbox(t, root, "sandbox", "gc", "--suspend-idle", "1s")
	if !strings.Contains(out, "suspend idle (idle ") || !strings.Contains(out, "suspend other (idle ") || strings.Contains(out, "would") || strings.Contains(out, "failed") {
		t.Fatalf("gc --suspend-idle 1s printed %q", out)
	}
	if got := states(); got != "idle=suspended other=suspended" {
		t.Fatalf("after gc --suspend-idle: %s", got)
	}
	suspendNoProcesses(t, idleID)
	if out := mustFlmbox(t, root, "sandbox", "gc", "--suspend-idle", "1s"); out != "" {
		t.Fatalf("gc --suspend-idle 1s of suspended sandboxes printed %q", out)
	}
	mustFlmbox(t, root, "sandbox", "resume", "other")

	idleFor(time.Second)
	out = mustFlmbox(t, root, "sandbox", "gc", "-n", "--remove-idle", "1s")
	if !strings.Contains(out, "would remove idle (idle ") || !strings.Contains(out, "would remove other (idle ") {
		t.Fatalf("gc --dry-run --remove-idle printed %q", out)
	}
	if got := states(); got != "idle=suspended other=running" {
		t.Fatalf("after gc --dry-run --remove-idle: %s", got)
	}
	// The dry run left the suspended sandbox whole.
	if res := flmbox(t, root, "run", "--sandbox", "idle", "-l", "shell", "-c", "cat /tmp/kept"); res.code != 0 || res.stdout != "kept\n" {
		t.Fatalf("the sandbox gc --dry-run saw: exit %d %q %q", res.code, res.stdout, res.stderr)
	}
	mustFlmbox(t, root, "sandbox", "suspend", "idle")

	idleFor(time.Second)
	out = mustFlmbox(t, root, "sandbox", "gc", "--remove-idle", "1s")
	if !strings.Contains(out, "remove idle (idle ") || !strings.Contains(out, "remove other (idle ") || strings.Contains(out, "would") || strings.Contains(out, "failed") {
		t.Fatalf("gc --remove-idle printed %q", out)
	}
	if got := sandboxNames(t, root); len(got) != 0 {
		t.Fatalf("after gc --remove-idle sandbox ls lists %v", got)
	}
	for _, n := range []string{"idle", "other"} {
		if _, err := os.Lstat(stateroot.Sandbox(root, n)); !os.IsNotExist(err) {
			t.Errorf("the directory of %s after gc --remove-idle: %v", n, err)
		}
	}
	if ls := leases(t, root); len(ls) != 0 {
		t.Errorf("image leases left: %+v", ls)
	}
	waitNoProcesses(t, idleID)
}
