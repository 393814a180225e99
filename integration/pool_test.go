//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox/record"
)

// Issue 15's warm pool, end to end: pool fill/ls/drain, and the commands
// that take sandboxes from a pool (run --image, run --batch --image,
// sandbox create) and give them back (the same, and sandbox rm).

// poolEntry is an element of pool ls --json.
type poolEntry struct {
	Shape       string   `json:"shape"`
	Image       string   `json:"image"`
	Size        int      `json:"size"`
	Idle        []string `json:"idle"`
	Refilling   bool     `json:"refilling"`
	RefillError string   `json:"refill_error"`
}

// poolLs runs pool ls --json (which removes expired idle sandboxes).
func poolLs(t *testing.T, root string) []poolEntry {
	t.Helper()
	var ps []poolEntry
	out := mustFlmbox(t, root, "pool", "ls", "--json")
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatalf("pool ls --json printed %q: %v", out, err)
	}
	return ps
}

// fillPool runs pool fill IMAGE --size size ARGS... and returns the pool
// it printed, after checking it holds size idle sandboxes.
func fillPool(t *testing.T, root, image string, size int, args ...string) poolEntry {
	t.Helper()
	var ps []poolEntry
	out := mustFlmbox(t, root, append([]string{"pool", "fill", image, "--size", fmt.Sprint(size), "--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), &ps); err != nil || len(ps) != 1 {
		t.Fatalf("pool fill --json printed %q: %v", out, err)
	}
	if p := ps[0]; p.Size != size || len(p.Idle) != size || p.RefillError != "" {
		t.Fatalf("pool fill --size %d made %+v", size, p)
	}
	return ps[0]
}

// poolRoot is sandboxRoot whose pools are drained when the test ends (once
// the refills that the test's commands started have finished), before its
// sandboxes are removed.
func poolRoot(t *testing.T, reg *testRegistry) string {
	t.Helper()
	root := sandboxRoot(t, reg)
	t.Cleanup(func() {
		waitRefills(t, root)
		flmbox(t, root, "pool", "drain")
		waitRefills(t, root)
	})
	return root
}

// refillProcesses are the pool refill processes (flmbox pool refill, which
// an Acquire starts detached) of root.
func refillProcesses(root string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		i := slices.Index(args, "--root")
		if i >= 0 && i+1 < len(args) && args[i+1] == root && slices.Contains(args, "refill") {
			out = append(out, e.Name()+" "+strings.Join(args, " "))
		}
	}
	return out
}

// waitRefills waits until no refill of root's pools runs: no refill
// process is left (one started detached may not hold its lock yet), and
// pool ls says none is at work.
func waitRefills(t *testing.T, root string) {
	t.Helper()
	pollUntil(t, 3*time.Minute, "the refills of the pools to end", func() bool {
		if len(refillProcesses(root)) > 0 {
			return false
		}
		for _, p := range poolLs(t, root) {
			if p.Refilling {
				return false
			}
		}
		return true
	})
}

// holdRefill takes the refill lock of the pool of shape (as a refill at
// work holds it) until the returned function is called: the refills that
// Acquires start meanwhile do nothing, so that a sandbox given back finds
// its pool below its size and is parked there again, not removed because a
// refill filled the pool first. It waits for the refill processes started
// meanwhile first.
func holdRefill(t *testing.T, root, shape string) (release func()) {
	t.Helper()
	fd, err := unix.Open(filepath.Join(stateroot.Pool(root), shape+".refill"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 3*time.Minute, "the refill lock of pool "+shape, func() bool { return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil })
	var once sync.Once
	release = func() {
		once.Do(func() {
			pollUntil(t, time.Minute, "the refill processes started while the refill lock was held to end", func() bool {
				return len(refillProcesses(root)) == 0
			})
			unix.Close(fd)
		})
	}
	t.Cleanup(release)
	return release
}

// runscIDs are the containers runsc lists under root.
func runscIDs(t *testing.T, root string) []string {
	t.Helper()
	if _, err := os.Stat(stateroot.Runsc(root)); err != nil {
		return nil
	}
	out, err := exec.Command(runscPath, "--root", stateroot.Runsc(root), "list", "-quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("runsc list: %v\n%s", err, out)
	}
	ids := strings.Fields(string(out))
	slices.Sort(ids)
	return ids
}

// checkOnlyPooled waits for the pools' refills, then checks that sandbox
// ls (which reconciles) lists only idle pooled sandboxes, want of them if
// want >= 0, that runsc runs exactly their containers and that the image
// leases are theirs. It returns their container IDs by name.
func checkOnlyPooled(t *testing.T, root string, want int) map[string]string {
	t.Helper()
	waitRefills(t, root)
	sbs := sandboxLs(t, root)
	byName := map[string]string{}
	var ids []string
	for _, sb := range sbs {
		if sb.State != "pooled" || !strings.HasPrefix(sb.Name, "pool-") {
			t.Errorf("sandbox %s (%s) is %s, want only idle pooled sandboxes", sb.Name, sb.ID, sb.State)
		}
		byName[sb.Name] = sb.ID
		ids = append(ids, sb.ID)
	}
	if want >= 0 && len(sbs) != want {
		t.Errorf("sandbox ls lists %d sandboxes, want %d: %+v", len(sbs), want, sbs)
	}
	slices.Sort(ids)
	if got := runscIDs(t, root); !slices.Equal(got, ids) {
		t.Errorf("runsc runs %q, the records name %q", got, ids)
	}
	var holders []string
	for _, l := range leases(t, root) {
		holders = append(holders, l.Holder)
	}
	if len(holders) != len(ids) {
		t.Errorf("image leases %q, want one per sandbox (%q)", holders, ids)
	}
	for _, h := range holders {
		if !slices.ContainsFunc(ids, func(id string) bool { return strings.HasSuffix(h, "."+id) }) {
			t.Errorf("image lease %s is no sandbox's", h)
		}
	}
	idle := 0
	for _, p := range poolLs(t, root) {
		idle += len(p.Idle)
		if p.RefillError != "" {
			t.Errorf("pool %s: refill failed: %s", p.Shape, p.RefillError)
		}
	}
	if idle != len(sbs) {
		t.Errorf("pool ls shows %d idle sandboxes, sandbox ls %d", idle, len(sbs))
	}
	return byName
}

// bootID prints the sandbox's gVisor boot ID: one per sandbox (its kernel),
// unchanged by resets.
const bootID = `print(open('/proc/sys/kernel/random/boot_id').read().strip())`

// TestPoolTenancy is the tenancy test across the pool: user A's run
// --image leaves everything tenantMess leaves (files in /tmp, hidden and
// locked ones, /dev/shm, System V and POSIX IPC, a setsid daemon, a
// pip-installed package, a sitecustomize.py and a .pth) and sees it; user
// B's run --image then gets the same sandbox (the same gVisor kernel and
// agent, the same runsc container, which the pool holds before and after),
// finds none of it, sees what user 0 saw in it fresh from pool fill, and
// its own code runs unaffected.
func TestPoolTenancy(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	p := fillPool(t, root, image, 1)
	id := sandboxID(t, root, p.Idle[0])
	// Each run takes the pool's last idle sandbox, which starts a refill:
	// held off, so that each gives its sandbox back to the pool.
	holdRefill(t, root, p.Shape)

	// run runs before, the check, the sandbox's boot ID and after in one
	// run --image, and returns what the check saw and what after printed.
	run := func(who, before, after string) (tenantView, string) {
		t.Helper()
		// What before made in /tmp/site-packages is importable (Python
		// remembers a sys.path entry it found missing at its start).
		code := before + "\nimport importlib; importlib.invalidate_caches()\n" + tenantCheck + "\n" + bootID + "\n" + after
		res := flmbox(t, root, "run", "--image", image, "--timeout", "60s", "-c", code)
		lines := strings.Split(res.stdout, "\n")
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, `{"left"`) })
		var v tenantView
		if res.code != 0 || i < 0 || i+1 >= len(lines) || json.Unmarshal([]byte(lines[i]), &v) != nil {
			t.Fatalf("user %s: exit %d\nstdout: %s\nstderr: %s", who, res.code, res.stdout, res.stderr)
		}
		v.View["boot_id"] = lines[i+1]
		if ps := poolLs(t, root); len(ps) != 1 || len(ps[0].Idle) != 1 || sandboxID(t, root, ps[0].Idle[0]) != id {
			t.Fatalf("after user %s, the pool holds %+v, want runsc container %s idle", who, ps, id)
		}
		return v, strings.Join(lines[i+2:], "\n")
	}
	zero, _ := run("0", "", "")
	if len(zero.Left) != 0 {
		t.Fatalf("a sandbox fresh from pool fill holds %q", zero.Left)
	}
	a, _ := run("A", tenantMess, "")
	for _, want := range []string{"/tmp/.hidden", "/tmp/.hidden-dir", "/tmp/locked", "/tmp/.locked-by-daemon", "/tmp/site-packages",
		"/tmp/json.py", "/dev/shm/.hidden", "/dev/shm/sem.tenant-sem", "/dev/shm/shm-file", "shm", "sem", "msg",
		"shm given away", "mqueue", "semaphore", "@tenant-a", "port 45111", "module tenantmod", "json.py"} {
		if !slices.Contains(a.Left, want) {
			t.Errorf("user A's check does not find %q: %q", want, a.Left)
		}
	}
	if !slices.ContainsFunc(a.Left, func(s string) bool { return strings.HasPrefix(s, "process ") }) {
		t.Errorf("user A's check does not find its daemon: %q", a.Left)
	}
	// B's own package, made as pip would make it, imports; json is the
	// standard library's.
	b, own := run("B", "", `import os
os.makedirs('/tmp/site-packages/bmod')
open('/tmp/site-packages/bmod/__init__.py', 'w').write('WHO = "B"\n')
import importlib; importlib.invalidate_caches()
import bmod, json
assert json.__file__.startswith('/usr/'), json.__file__
print(bmod.WHO, json.dumps([1]))`)
	if len(b.Left) != 0 {
		t.Errorf("user B finds %q", b.Left)
	}
	if own != "B [1]\n" {
		t.Errorf("user B's own code printed %q", own)
	}
	if a.View["boot_id"] != zero.View["boot_id"] || b.View["boot_id"] != a.View["boot_id"] || b.AgentStart != a.AgentStart || a.AgentStart != zero.AgentStart {
		t.Errorf("not one sandbox: boot IDs %v, %v, %v; agent started at %s, %s, %s",
			zero.View["boot_id"], a.View["boot_id"], b.View["boot_id"], zero.AgentStart, a.AgentStart, b.AgentStart)
	}
	for k, v := range zero.View {
		if !reflect.DeepEqual(b.View[k], v) {
			t.Errorf("%s for user B:\n%v\nfor user 0:\n%v", k, b.View[k], v)
		}
	}
	// The sandbox the pool holds is the one the three users had.
	if out := mustFlmbox(t, root, "sandbox", "create", "--image", image, "--name", "probe"); strings.TrimSpace(out) != "probe" {
		t.Fatalf("sandbox create printed %q", out)
	}
	if got := sandboxID(t, root, "probe"); got != id {
		t.Errorf("sandbox create made runsc container %s, want the pool's %s", got, id)
	}
	if res := runIn(t, root, "probe", bootID); res.code != 0 || strings.TrimSpace(res.stdout) != b.View["boot_id"] {
		t.Errorf("the pool's sandbox has boot ID %q (exit %d, %s), the users had %v", res.stdout, res.code, res.stderr, b.View["boot_id"])
	}
	mustFlmbox(t, root, "sandbox", "rm", "probe")
}

// TestPoolAcquireRace: two processes that acquire from a pool of one at
// the same instant (sandbox create --image) get different sandboxes,
// exactly one of them the pooled one; both take calls.
func TestPoolAcquireRace(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	for round := range 3 {
		waitRefills(t, root)
		for _, sb := range sandboxLs(t, root) {
			if sb.State != "pooled" {
				mustFlmbox(t, root, "sandbox", "rm", sb.Name)
			}
		}
		mustFlmbox(t, root, "pool", "drain")
		p := fillPool(t, root, image, 1)
		pooled := sandboxID(t, root, p.Idle[0])
		var wg sync.WaitGroup
		var outs [2]bytes.Buffer
		var errs [2]error
		cmds := [2]*exec.Cmd{}
		for i := range cmds {
			cmds[i] = exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "sandbox", "create", "--image", image)
			cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
		}
		for i := range cmds {
			if errs[i] = cmds[i].Start(); errs[i] != nil {
				t.Fatal(errs[i])
			}
		}
		for i := range cmds {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = cmds[i].Wait() }()
		}
		wg.Wait()
		var names, ids []string
		for i := range cmds {
			if errs[i] != nil {
				t.Fatalf("round %d: sandbox create: %v\n%s", round, errs[i], outs[i].String())
			}
			name := strings.TrimSpace(outs[i].String())
			names = append(names, name)
			ids = append(ids, sandboxID(t, root, name))
			if res := runIn(t, root, name, "print('ran')"); res.code != 0 || res.stdout != "ran\n" {
				t.Errorf("round %d: call %s: exit %d %q %q", round, name, res.code, res.stdout, res.stderr)
			}
		}
		if names[0] == names[1] || ids[0] == ids[1] {
			t.Fatalf("round %d: both got sandbox %s (%s)", round, names[0], ids[0])
		}
		if n := len(slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id != pooled })); n != 1 {
			t.Errorf("round %d: %d of the sandboxes %q (runsc %q) are the pooled %s, want exactly one", round, n, names, ids, pooled)
		}
		t.Logf("round %d: %q got %q; the pool's was %s", round, names, ids, pooled)
		mustFlmbox(t, root, append([]string{"sandbox", "rm"}, names...)...)
	}
	waitRefills(t, root)
	mustFlmbox(t, root, "pool", "drain")
	checkOnlyPooled(t, root, 0)
}

// TestPoolAdopterKilled: a run --image that took the pool's sandbox and is
// SIGKILLed, at several points (at once; once it has adopted the sandbox;
// while its snippet runs; while it gives the sandbox back, resetting it),
// never leaves a sandbox both pooled and used, nor one lost: after sandbox
// ls every sandbox is idle in its pool and clean, runsc runs exactly their
// containers, and the killed one is gone unless it never left the pool.
func TestPoolAdopterKilled(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	// slowReset leaves 20,000 files in /tmp, which the reset of the
	// sandbox given back removes: it takes a while.
	const slowReset = `import os
for i in range(20000):
    open('/tmp/f%d' % i, 'w').close()
print('done')`
	for _, tc := range []struct {
		name string
		code string
		// hold holds off the refill that taking the pool's last sandbox
		// starts, which would fill the pool first: the sandbox given back
		// would be removed, not reset.
		hold bool
		// wait returns once the adopter is where it is to be killed; it
		// reports whether the sandbox has left the pool by then.
		wait func(t *testing.T, k *killable, id, pooledName string) bool
	}{
		{"at once", ownerSnippet, false, func(*testing.T, *killable, string, string) bool { return false }},
		{"once adopted", ownerSnippet, false, func(t *testing.T, k *killable, id, _ string) bool {
			pollUntil(t, 2*time.Minute, "run --image to adopt the pool's sandbox", func() bool {
				k.mustRun(t, "flmbox run --image")
				rec := recordOf(root, id)
				return rec != nil && rec.Pooled == nil
			})
			return true
		}},
		{"while its snippet runs", ownerSnippet, false, func(t *testing.T, k *killable, id, _ string) bool {
			pollUntil(t, 2*time.Minute, "the snippet to run in the pool's sandbox", func() bool {
				k.mustRun(t, "flmbox run --image")
				rec := recordOf(root, id)
				return rec != nil && rec.Pooled == nil && rec.Owner != nil && rec.Owner.PID == k.cmd.Process.Pid &&
					flmbox(t, root, "run", "--sandbox", rec.Name, "-l", "shell", "-c", "test -e /tmp/up").code == 0
			})
			return true
		}},
		{"while it gives the sandbox back", slowReset, true, func(t *testing.T, k *killable, id, pooledName string) bool {
			// The release renames the sandbox to a new pool name, owned by
			// the releasing process, then resets it.
			for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Millisecond) {
				k.mustRun(t, "flmbox run --image")
				rec := recordOf(root, id)
				if rec != nil && rec.Name != pooledName && strings.HasPrefix(rec.Name, "pool-") && rec.Pooled == nil &&
					rec.Owner != nil && rec.Owner.PID == k.cmd.Process.Pid {
					return true
				}
				if time.Now().After(deadline) {
					t.Fatalf("not within 2m: run --image to give its sandbox back")
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fillPool(t, root, image, 1)
			id := sandboxID(t, root, p.Idle[0])
			release := func() {}
			if tc.hold {
				release = holdRefill(t, root, p.Shape)
			}
			k := startKillable(t, exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "run", "--image", image, "--timeout", "10m", "-c", tc.code))
			left := tc.wait(t, k, id, p.Idle[0])
			k.kill()
			release()
			if rec := recordOf(root, id); rec == nil || rec.Pooled == nil || rec.Name != p.Idle[0] {
				left = true // killed at once, it had taken it all the same
			}
			t.Logf("killed flmbox run --image (pid %d) %s; its sandbox is %+v", k.cmd.Process.Pid, tc.name, recordOf(root, id))
			byName := checkOnlyPooled(t, root, -1)
			if left && slices.Contains(slices.Collect(maps.Values(byName)), id) {
				t.Errorf("the sandbox the killed flmbox had taken (%s) is idle in the pool again: %v", id, byName)
			}
			if len(byName) > 1 {
				t.Errorf("the pool of size 1 holds %d idle sandboxes: %v", len(byName), byName)
			}
			if !left && byName[p.Idle[0]] != id {
				t.Errorf("the sandbox the killed flmbox never took (%s, %s) left the pool: %v", p.Idle[0], id, byName)
			}
			// The idle sandboxes are clean: each run --image takes one.
			for range byName {
				res := flmbox(t, root, "run", "--image", image, "-l", "shell", "-c", "ls -A /tmp /dev/shm")
				if res.code != 0 || res.stdout != "/dev/shm:\n\n/tmp:\n" {
					t.Errorf("an idle sandbox after the kill: exit %d\nstdout: %q\nstderr: %s", res.code, res.stdout, res.stderr)
				}
			}
			if !left {
				return
			}
			waitNoProcesses(t, id)
		})
	}
	waitRefills(t, root)
	mustFlmbox(t, root, "pool", "drain")
	checkOnlyPooled(t, root, 0)
}

// recordOf reads the record of the sandbox whose runsc container is id,
// whatever its name; nil if there is none.
func recordOf(root, id string) *record.Record {
	ents, _ := os.ReadDir(stateroot.Sandboxes(root))
	for _, e := range ents {
		if rec, err := record.ReadDir(stateroot.Sandbox(root, e.Name())); err == nil && rec.ID == id {
			return rec
		}
	}
	return nil
}

// TestPoolBatch: run --batch --image with two workers takes the pool's two
// sandboxes (their boot IDs, learnt first by adopting them with sandbox
// create, are the ones the snippets see); the results keep their order;
// afterwards the pool holds two idle sandboxes and nothing else is left.
func TestPoolBatch(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	p := fillPool(t, root, image, 2)
	pooled := map[string]string{} // boot ID -> runsc container
	release := holdRefill(t, root, p.Shape)
	for _, name := range []string{"probe1", "probe2"} {
		mustFlmbox(t, root, "sandbox", "create", "--image", image, "--name", name)
		res := runIn(t, root, name, bootID)
		if res.code != 0 {
			t.Fatalf("boot ID of %s: exit %d %s", name, res.code, res.stderr)
		}
		pooled[strings.TrimSpace(res.stdout)] = sandboxID(t, root, name)
	}
	mustFlmbox(t, root, "sandbox", "release", "probe1", "probe2")
	release()
	ids := slices.Sorted(maps.Values(checkOnlyPooled(t, root, 2)))
	if probed := slices.Sorted(maps.Values(pooled)); len(pooled) != 2 || !slices.Equal(probed, ids) {
		t.Fatalf("the probes took %v; the pool holds %q", pooled, ids)
	}

	var codes []string
	for i := range 64 {
		codes = append(codes, fmt.Sprintf("print(%d, open('/proc/sys/kernel/random/boot_id').read().strip())", i))
	}
	in, _ := json.Marshal(map[string]any{"codes": codes})
	results := runBatch(t, root, in, 64, "--image", image, "--parallel", "2")
	seen := map[string]int{}
	for i, r := range results {
		f := strings.Fields(r.Stdout)
		if r.ExitCode != 0 || len(f) != 2 || f[0] != fmt.Sprint(i) {
			t.Fatalf("element %d: %+v", i, r)
		}
		seen[f[1]]++
	}
	for boot, id := range pooled {
		if seen[boot] == 0 {
			t.Errorf("no snippet ran in the pool's sandbox %s (boot ID %s): the snippets saw %v", id, boot, seen)
		}
	}
	if len(seen) != 2 {
		t.Errorf("the snippets ran in %d sandboxes, want the pool's 2: %v", len(seen), seen)
	}
	checkOnlyPooled(t, root, 2)
	if ps := poolLs(t, root); len(ps) != 1 || ps[0].Size != 2 || len(ps[0].Idle) != 2 {
		t.Errorf("pool ls after the batch: %+v", ps)
	}
}

// TestPoolFillMissingImage: pool fill of an image that neither the cache
// nor its registry holds fails (exit 125, naming the image) and leaves no
// pool settings and no sandbox.
func TestPoolFillMissingImage(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	layout := filepath.Join(t.TempDir(), "nolayout")
	for image, named := range map[string]string{
		reg.host + "/flmbox/missing:1":         reg.host + "/flmbox/missing:1",
		reg.host + "/" + repo + ":no-such-tag": reg.host + "/" + repo + ":no-such-tag",
		"oci-layout:" + layout:                 layout, // the layout's directory
	} {
		res := flmbox(t, root, "pool", "fill", image, "--size", "2")
		if res.code != 125 || !strings.Contains(res.stderr, named) {
			t.Errorf("pool fill %s: exit %d, want 125 and a message naming it\nstdout: %s\nstderr: %s", image, res.code, res.stdout, res.stderr)
		}
		if ps := poolLs(t, root); len(ps) != 0 {
			t.Errorf("pool ls after pool fill %s failed: %+v", image, ps)
		}
		if ents, _ := os.ReadDir(stateroot.Pool(root)); slices.ContainsFunc(ents, func(e os.DirEntry) bool { return strings.HasSuffix(e.Name(), ".json") }) {
			t.Errorf("pool settings left by pool fill %s: %v", image, ents)
		}
		checkOnlyPooled(t, root, 0)
	}
}

// TestPoolDrainWhileAcquiring: pool drain while run --image commands take
// sandboxes from the pool and give them back: every run succeeds, and
// afterwards no pool and no sandbox is left.
func TestPoolDrainWhileAcquiring(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	for round := range 2 {
		fillPool(t, root, image, 3)
		const runs = 6
		var wg sync.WaitGroup
		results := make([]result, runs+1)
		for i := range runs + 1 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i == runs {
					time.Sleep(time.Duration(round) * 200 * time.Millisecond) // the drain at the start, then among them
					results[i] = flmbox(t, root, "pool", "drain")
					return
				}
				results[i] = flmbox(t, root, "run", "--image", image, "-c", fmt.Sprintf("import time; time.sleep(0.%d); print(%d)", i, i))
			}()
		}
		wg.Wait()
		for i, res := range results[:runs] {
			if res.code != 0 || res.stdout != fmt.Sprintf("%d\n", i) {
				t.Errorf("round %d: run %d: exit %d\nstdout: %s\nstderr: %s", round, i, res.code, res.stdout, res.stderr)
			}
		}
		if res := results[runs]; res.code != 0 {
			t.Errorf("round %d: pool drain: exit %d\nstdout: %s\nstderr: %s", round, res.code, res.stdout, res.stderr)
		}
		checkOnlyPooled(t, root, 0)
		if ps := poolLs(t, root); len(ps) != 0 {
			t.Errorf("round %d: pool ls after the drain: %+v", round, ps)
		}
	}
}

// TestPoolSandboxCreateRm: sandbox create --image --name adopts the pool's
// idle sandbox (its runsc container) under that name; it takes calls; sandbox
// rm gives it back to the pool, reset, under a new pool name (its old names
// reach it no more); an idle pooled sandbox refuses calls (exit 125, saying
// it is idle in a pool).
func TestPoolSandboxCreateRm(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	p := fillPool(t, root, image, 1)
	id := sandboxID(t, root, p.Idle[0])
	// The create takes the pool's last idle sandbox, which starts a
	// refill: held off, so that sandbox release finds the pool below its
	// size.
	release := holdRefill(t, root, p.Shape)

	if res := runIn(t, root, p.Idle[0], "print('idle')"); res.code != 125 || res.stdout != "" || !strings.Contains(res.stderr, "idle in a pool") {
		t.Errorf("run --sandbox %s, idle in the pool: exit %d\nstdout: %s\nstderr: %s", p.Idle[0], res.code, res.stdout, res.stderr)
	}
	if out := strings.TrimSpace(mustFlmbox(t, root, "sandbox", "create", "--image", image, "--name", "work")); out != "work" {
		t.Fatalf("sandbox create printed %q", out)
	}
	var work sandboxEntry
	for _, sb := range sandboxLs(t, root) {
		if sb.Name == "work" {
			work = sb
		}
	}
	if work.ID != id || work.State != "running" || work.OwnerPID != 0 || work.Shape != p.Shape {
		t.Errorf("sandbox work is %+v, want the pool's %s, running, of shape %s, without an owner", work, id, p.Shape)
	}
	if ps := poolLs(t, root); len(ps) != 1 || len(ps[0].Idle) != 0 {
		t.Errorf("pool ls with its sandbox adopted: %+v", ps)
	}
	if res := runIn(t, root, p.Idle[0], "print('old name')"); res.code != 125 {
		t.Errorf("run --sandbox %s, its old name: exit %d %s", p.Idle[0], res.code, res.stderr)
	}
	if res := runIn(t, root, "work", "open('/tmp/mine', 'w').write('work'); print(open('/tmp/mine').read())"); res.code != 0 || res.stdout != "work\n" {
		t.Fatalf("run --sandbox work: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	mustFlmbox(t, root, "sandbox", "release", "work")
	if res := runIn(t, root, "work", "print(1)"); res.code != 125 || !strings.Contains(res.stderr, `no sandbox "work"`) {
		t.Errorf("run --sandbox work after sandbox release: exit %d %s", res.code, res.stderr)
	}
	ps := poolLs(t, root)
	if len(ps) != 1 || len(ps[0].Idle) != 1 {
		t.Fatalf("pool ls after sandbox release work: %+v, want its sandbox idle again", ps)
	}
	idle := ps[0].Idle[0]
	if !strings.HasPrefix(idle, "pool-") || idle == p.Idle[0] || sandboxID(t, root, idle) != id {
		t.Errorf("the pool holds %s (%s), want runsc container %s under a new pool name (not %s)", idle, sandboxID(t, root, idle), id, p.Idle[0])
	}
	res := runIn(t, root, idle, "print('idle')")
	if res.code != 125 || res.stdout != "" || !strings.Contains(res.stderr, "idle in a pool") {
		t.Errorf("run --sandbox %s, idle in the pool: exit %d\nstdout: %s\nstderr: %s", idle, res.code, res.stdout, res.stderr)
	}
	// Reset: the next user finds no trace of work's file.
	if res := flmbox(t, root, "run", "--image", image, "-l", "shell", "-c", "ls -A /tmp"); res.code != 0 || res.stdout != "" {
		t.Errorf("run --image after sandbox release work: exit %d\nstdout: %q\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	release()
	checkOnlyPooled(t, root, 1)
}

// TestPoolDrainExpired: pool drain --expired removes the idle sandboxes
// past their pool's idle timeout, and only those: a pool of another shape
// with the default timeout keeps its sandbox, and the expired pool keeps
// its size; then pool drain --shape drains that other pool alone.
func TestPoolDrainExpired(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	short := fillPool(t, root, image, 2, "--idle-timeout", "1s")
	long := fillPool(t, root, image, 1, "--env", "POOLTEST=long")
	if short.Shape == long.Shape {
		t.Fatalf("two shapes share key %s", short.Shape)
	}
	var removed []string
	pollUntil(t, 2*time.Minute, "pool drain --expired to remove the pool of 1 s's sandboxes", func() bool {
		removed = append(removed, strings.Fields(mustFlmbox(t, root, "pool", "drain", "--expired"))...)
		return len(removed) >= 2
	})
	slices.Sort(removed)
	want := slices.Sorted(slices.Values(short.Idle))
	if !slices.Equal(removed, want) {
		t.Errorf("pool drain --expired removed %q, want %q", removed, want)
	}
	for _, p := range poolLs(t, root) {
		switch p.Shape {
		case short.Shape:
			if p.Size != 2 || len(p.Idle) != 0 {
				t.Errorf("the expired pool: %+v, want size 2 kept, nothing idle", p)
			}
		case long.Shape:
			if p.Size != 1 || !slices.Equal(p.Idle, long.Idle) {
				t.Errorf("the pool with the default timeout: %+v, want %q idle", p, long.Idle)
			}
		default:
			t.Errorf("pool ls lists %+v", p)
		}
	}
	if sbs := checkOnlyPooled(t, root, 1); sbs[long.Idle[0]] == "" {
		t.Errorf("sandboxes left: %v, want %s", sbs, long.Idle[0])
	}
	// By shape: one pool of the image goes, the other keeps its size.
	if out := strings.Fields(mustFlmbox(t, root, "pool", "drain", "--shape", long.Shape)); !slices.Equal(out, long.Idle) {
		t.Errorf("pool drain --shape %s removed %q, want %q", long.Shape, out, long.Idle)
	}
	if ps := poolLs(t, root); len(ps) != 1 || ps[0].Shape != short.Shape || ps[0].Size != 2 {
		t.Errorf("pools after pool drain --shape %s: %+v, want only %s, its size kept", long.Shape, ps, short.Shape)
	}
}

// TestPoolIdleRefusalAdvice: the refusal of a call to an idle pooled
// sandbox advises nothing wrong: it is not being created, and if it says to
// remove the sandbox with sandbox rm, that command removes it.
func TestPoolIdleRefusalAdvice(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	p := fillPool(t, root, reg.digestRef(), 1)
	idle := p.Idle[0]
	res := runIn(t, root, idle, "print('idle')")
	if res.code != 125 || !strings.Contains(res.stderr, "idle in a pool") {
		t.Fatalf("run --sandbox %s, idle in the pool: exit %d\nstdout: %s\nstderr: %s", idle, res.code, res.stdout, res.stderr)
	}
	if strings.Contains(res.stderr, "wait until it is created") {
		t.Errorf("the refusal advises waiting for a sandbox that is not being created:\n%s", res.stderr)
	}
	if strings.Contains(res.stderr, "flmbox sandbox rm "+idle) {
		mustFlmbox(t, root, "sandbox", "rm", idle)
		if state := sandboxNames(t, root)[idle]; state != "" {
			t.Errorf("the refusal advises flmbox sandbox rm %s, which exits 0 and leaves it %s", idle, state)
		}
	}
}
