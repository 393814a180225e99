//go:build integration

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// soakMemory and soakPids are the soak sandbox's --memory and --pids: the
// smallest flmbox accepts.
const soakMemory, soakPids = "256MiB", "64"

// soakRounds is how many times the soak makes each hostile call: the
// second time, on what the first left.
const soakRounds = 2

// TestSoakHostileAndOrdinaryCalls makes calls on one small sandbox, a
// hostile snippet (of the fault list and others) every second call, an
// ordinary one between, each hostile one soakRounds times (60 calls). Not
// among them: several processes growing at full speed at once, which can
// still outrun the memory watch (see docs/ARCHITECTURE.md, "the promise and
// its limits"; four forked hogs lost the sandbox once in two make test runs
// side by side): every ordinary call answers correctly, no hostile one makes
// flmbox fail (exit 125: the sandbox dead or wedged), the sandbox's /tmp
// keeps its first file, and its cgroups never met their memory and pids
// limits.
func TestSoakHostileAndOrdinaryCalls(t *testing.T) {
	// Not parallel: its memory hogs race the agent's memory watch, which other tests' load slows.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	const name = "soak"
	createSandbox(t, root, reg, name, "--memory", soakMemory, "--pids", soakPids, "--tmp-size", "16MiB")
	if res := runIn(t, root, name, "echo kept > /tmp/keep", "-l", "shell"); res.code != 0 {
		t.Fatalf("write /tmp/keep: %+v", res)
	}
	hostile := []struct {
		name, lang, code, timeout string
	}{
		{"many small files", "python", "import os\nos.makedirs('/tmp/h', exist_ok=True)\nfor i in range(1000000): open('/tmp/h/f%d' % i, 'w').close()", "20s"},
		{"files removed", "shell", "rm -rf /tmp/h /tmp/fill", "20s"},
		{"SIGSTOP of pid 1", "python", "import os, signal\nos.kill(1, signal.SIGSTOP)", "5s"},
		{"SIGKILL of pid 1", "python", "import os, signal\nos.kill(1, signal.SIGKILL)", "5s"},
		{"kill -9 -1", "shell", "kill -STOP -1; kill -9 -1", "5s"},
		{"the agent's socket", "python", agentAttempts, "20s"},
		{"memory hog", "python", "x = []\nwhile True: x.append(bytearray(4 << 20))", "10s"},
		{"one allocation of 1 GiB", "python", "x = b'x' * (1 << 30)", "10s"},
		{"fork bomb", "shell", "b(){ b|b& }; b & while :; do :; done", "3s"},
		{"fork loop", "python", "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(60)\n    except OSError:\n        time.sleep(0.01)", "3s"},
		{"thread loop", "python", "import threading, time\nwhile True:\n    try:\n        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n    except RuntimeError:\n        time.sleep(0.01)", "3s"},
		{"/tmp filled", "shell", "head -c 100000000 /dev/zero > /tmp/fill", "10s"},
		{"output flood", "shell", "yes flood", "2s"},
		{"infinite loop", "python", "while True: pass", "1s"},
		{"setsid daemon", "shell", "setsid sh -c 'while :; do :; done' & echo started", "5s"},
	}
	ordinary := []struct {
		lang, code, want string
	}{
		{"python", "print(sum(range(1000)))", "499500\n"},
		{"shell", "cat /tmp/keep", "kept\n"},
	}
	// An ordinary call after each hostile one, Python and shell in turn:
	// as len(hostile) is odd, each hostile call is followed by both kinds
	// over the two rounds.
	for i := range soakRounds * 2 * len(hostile) {
		if i%2 == 1 {
			h := hostile[(i/2)%len(hostile)]
			res := runIn(t, root, name, h.code, "-l", h.lang, "--timeout", h.timeout, "--max-output", "64KiB")
			if res.code == 125 || res.code < 0 {
				t.Fatalf("call %d, %s: flmbox failed: exit %d\n%s", i, h.name, res.code, res.stderr)
			}
			continue
		}
		o := ordinary[(i/2)%len(ordinary)]
		if res := runIn(t, root, name, o.code, "-l", o.lang); res.code != 0 || res.stdout != o.want {
			t.Fatalf("call %d, an ordinary one after %q: exit %d stdout %q stderr %q", i, hostile[((i/2)+len(hostile)-1)%len(hostile)].name, res.code, res.stdout, res.stderr)
		}
	}
	if got := sandboxState(t, root, name, "--probe"); got != "running" {
		t.Fatalf("after the soak sandbox ls says %q", got)
	}
	// The host's memory cgroup of the sandbox never hit its limit.
	if n := sandboxOOMKills(t, root, name); n != 0 {
		t.Fatalf("the sandbox's memory cgroup counted %d OOM kills", n)
	}
	// Nor its pids cgroup: the sentry got every thread it asked for.
	if n := sandboxPidsMax(t, root, name); n != 0 {
		t.Fatalf("the sandbox's pids cgroup refused %d tasks", n)
	}
}

// sandboxOOMKills returns the oom_kill count of sandbox name's memory
// cgroup on the host (cgroup v1 or v2).
func sandboxOOMKills(t *testing.T, root, name string) int {
	t.Helper()
	return sandboxCgroupEvents(t, root, name, "memory", "memory.oom_control", "memory.events", "oom_kill")
}

// sandboxPidsMax returns how many times sandbox name's pids cgroup on the
// host refused a task for its limit (cgroup v1 or v2).
func sandboxPidsMax(t *testing.T, root, name string) int {
	t.Helper()
	return sandboxCgroupEvents(t, root, name, "pids", "pids.events", "pids.events", "max")
}

// sandboxCgroupEvents returns the count key of sandbox name's cgroup of
// controller on the host: file v1 in the controller's v1 hierarchy, file v2
// in the unified one.
func sandboxCgroupEvents(t *testing.T, root, name, controller, v1, v2, key string) int {
	t.Helper()
	file := sandboxCgroupFile(t, root, name, controller, v1, v2)
	events, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the sandbox's %s cgroup: %v", controller, err)
	}
	for _, l := range strings.Split(string(events), "\n") {
		if v, ok := strings.CutPrefix(l, key+" "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no %s in %s", key, events)
	return 0
}

// sandboxCgroupFile returns the path of sandbox name's cgroup file of
// controller on the host: file v1 in the controller's v1 hierarchy, file v2
// in the unified one.
func sandboxCgroupFile(t *testing.T, root, name, controller, v1, v2 string) string {
	t.Helper()
	id := sandboxID(t, root, name)
	out, err := exec.Command(runscPath, "--root", stateroot.Runsc(root), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state: %v", err)
	}
	i := strings.Index(string(out), `"pid":`)
	if i < 0 {
		t.Fatalf("runsc state printed %s", out)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.Split(strings.Split(string(out[i+6:]), ",")[0], "\n")[0]))
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var file string
	for _, l := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		f := strings.SplitN(l, ":", 3)
		switch {
		case len(f) != 3:
		case f[1] == controller || strings.Contains(f[1], controller+",") || strings.HasSuffix(f[1], ","+controller):
			file = filepath.Join("/sys/fs/cgroup", f[1], f[2], v1)
		case f[0] == "0" && f[1] == "" && file == "":
			file = filepath.Join("/sys/fs/cgroup", f[2], v2)
		}
	}
	if file == "" {
		t.Fatalf("the sandbox has no %s cgroup: %s", controller, cg)
	}
	return file
}
