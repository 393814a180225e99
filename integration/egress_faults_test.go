//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/vishvananda/netns"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/networld"
)

// TestEgressCreateKilled: an egress sandbox's create SIGKILLed when runsc
// starts (its network, table and resolver made) or after runsc made the
// container leaves what the next command's Reconcile removes whole: the
// worker's links, routes, nftables tables, namespaces, mounts and
// processes are as before, and its forwarding is off again. So does the
// removal of a suspended egress sandbox.
func TestEgressCreateKilled(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	w := networld.Start(t)
	before, err := w.WorkerState()
	if err != nil {
		t.Fatal(err)
	}
	for _, when := range []string{"before", "after"} {
		name := "killed-" + when
		args := []string{"sandbox", "create", "--name", name, "--image", reg.digestRef(), "--network", "egress",
			"--allow", "allowed.test", "--dns", networld.DNSAddr}
		cmd := w.Command(context.Background(), flmboxBin, append([]string{"--root", root, "--runsc", hookedRunsc(t)}, args...)...)
		killCmdAt(t, killPoint{verb: "run", when: when}, cmd, args)
		mid, err := w.WorkerState()
		if err != nil {
			t.Fatal(err)
		}
		// The resolver starts while runsc boots: it may not be there yet.
		if !strings.Contains(mid.String(), "inet flmbox-") {
			t.Fatalf("killed %s runsc run: no table to clean up, the test kills too early:\n%s", when, mid)
		}
		out := mustFlmboxIn(t, w, root, "sandbox", "ls", "--json")
		if strings.Contains(out, name) {
			t.Fatalf("sandbox ls after a killed create lists it: %s", out)
		}
		if after, ok := egressStateBack(t, w, before); !ok {
			t.Fatalf("a create killed %s runsc run left, after Reconcile:\n%s\nbefore:\n%s", when, after, before)
		}
	}
	// A suspended egress sandbox keeps its namespace, link and table, not
	// its resolver; its removal takes them all.
	mustFlmboxIn(t, w, root, "sandbox", "create", "--name", "suspended", "--image", reg.digestRef(), "--network", "egress",
		"--allow", "allowed.test", "--dns", networld.DNSAddr)
	mustFlmboxIn(t, w, root, "sandbox", "suspend", "suspended")
	ts, err := routerNftables(t, w).ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if procs := resolverProcs(t, root); len(procs) > 0 || !slices.ContainsFunc(ts, func(x *nftables.Table) bool { return x.Name == sandboxID(t, root, "suspended") }) {
		t.Fatalf("a suspended egress sandbox: want its table and no resolver: resolver %v, the router's tables %v", procs, ts)
	}
	mustFlmboxIn(t, w, root, "sandbox", "rm", "suspended")
	if after, ok := egressStateBack(t, w, before); !ok {
		t.Fatalf("removing a suspended egress sandbox left:\n%s\nbefore:\n%s", after, before)
	}
}

// egressResolverUnprivileged checks that each resolver in s is two
// processes of a user of their own (not 65534, whom any "nobody" process
// could signal), gaining nothing by execve, in a cgroup of their own bounded
// in memory and tasks: flmbox-resolver with CAP_NET_ADMIN only, and its DNS
// part, which parses what a sandbox sends, with no capability and a
// seccomp filter.
func egressResolverUnprivileged(t *testing.T, root string) {
	t.Helper()
	u, err := user.Lookup("flmbox-resolver")
	if err != nil {
		t.Fatal(err)
	}
	ids := "\t" + u.Uid + "\t" + u.Uid + "\t" + u.Uid + "\t" + u.Uid + "\n"
	want := map[string][]string{
		"flmbox-resolver": {"\nUid:" + ids, "\nCapEff:\t0000000000001000\n", "\nCapPrm:\t0000000000001000\n",
			"\nCapInh:\t0000000000000000\n", "\nCapAmb:\t0000000000000000\n", "\nNoNewPrivs:\t1\n"},
		"flmbox-dns": {"\nUid:" + ids, "\nCapEff:\t0000000000000000\n", "\nCapPrm:\t0000000000000000\n",
			"\nCapInh:\t0000000000000000\n", "\nCapAmb:\t0000000000000000\n", "\nNoNewPrivs:\t1\n", "\nSeccomp:\t2\n"},
	}
	n := map[string]int{}
	for _, p := range resolverProcs(t, root) {
		pid, comm, _ := strings.Cut(p, " ")
		if want[comm] == nil {
			continue
		}
		n[comm]++
		b, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want[comm] {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s %s: no %q in its status:\n%s", comm, pid, strings.TrimSpace(w), b)
			}
		}
		files := map[string]string{"flmbox-resolver": "64", "flmbox-dns": "2048"}[comm]
		lim, _ := os.ReadFile("/proc/" + pid + "/limits")
		if !regexp.MustCompile(`Max open files +` + files + ` +` + files + ` `).Match(lim) {
			t.Errorf("%s %s: want at most %s descriptors:\n%s", comm, pid, files, lim)
		}
		cg, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		var memory, pids string
		for _, line := range strings.Split(string(cg), "\n") {
			if f := strings.SplitN(line, ":", 3); len(f) == 3 && (f[1] == "memory" || f[1] == "") && strings.Contains(f[2], "/flmbox-resolvers/") {
				memory = f[2]
			} else if len(f) == 3 && f[1] == "pids" && strings.Contains(f[2], "/flmbox-resolvers/") {
				pids = f[2]
			}
		}
		if memory == "" {
			t.Errorf("%s %s is in no cgroup of the resolvers':\n%s", comm, pid, cg)
			continue
		}
		limit, _ := os.ReadFile("/sys/fs/cgroup/memory" + memory + "/memory.limit_in_bytes")
		if pids == "" { // cgroup v2: one cgroup
			limit, _ = os.ReadFile("/sys/fs/cgroup" + memory + "/memory.max")
			pids = memory
		}
		max, _ := os.ReadFile("/sys/fs/cgroup/pids" + pids + "/pids.max")
		if m, _ := os.ReadFile("/sys/fs/cgroup" + pids + "/pids.max"); len(m) > 0 {
			max = m
		}
		if strings.TrimSpace(string(limit)) != "67108864" || strings.TrimSpace(string(max)) != "64" {
			t.Errorf("%s %s: cgroup memory limit %q, pids.max %q, want 64 MiB and 64", comm, pid, limit, max)
		}
	}
	if n["flmbox-resolver"] == 0 || n["flmbox-resolver"] != n["flmbox-dns"] {
		t.Errorf("resolvers and DNS parts of %s: %v: %v", root, n, resolverProcs(t, root))
	}
}

// resolverProcs are the resolver processes of the sandboxes of state root
// root ("PID COMM"): their guards live in the egress router's namespace, not
// the worker's, so they are found by their command line, which names their
// configuration in the sandbox's directory.
func resolverProcs(t *testing.T, root string) []string {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		args := strings.Split(string(b), "\x00")
		if err != nil || len(args) < 2 || filepath.Base(args[0]) != "flmbox-resolver" || !strings.HasPrefix(args[1], root+"/") {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + d.Name() + "/comm")
		out = append(out, d.Name()+" "+strings.TrimSpace(string(comm)))
	}
	return out
}

// killResolver SIGKILLs the resolver's guard of state root root's one egress
// sandbox (its DNS part, whose channel closes, leaves too).
func killResolver(t *testing.T, root, comm string) {
	t.Helper()
	var pids []int
	for _, p := range resolverProcs(t, root) {
		pid, c, _ := strings.Cut(p, " ")
		if c == comm {
			n, _ := strconv.Atoi(pid)
			pids = append(pids, n)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("%d processes %s, want 1: %v", len(pids), comm, resolverProcs(t, root))
	}
	if err := unix.Kill(pids[0], unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// routerNftables is a connection to nftables in the egress router of w's
// worker: the namespace flmbox binds at /run/flmbox/egress-router-COOKIE,
// COOKIE the worker namespace's (docs/ARCHITECTURE.md).
func routerNftables(t *testing.T, w *networld.World) *nftables.Conn {
	t.Helper()
	worker, err := netns.GetFromPath(w.WorkerNetNS())
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()
	cookie := make(chan uint64, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends in the worker's namespace
		if err := netns.Set(worker); err != nil {
			t.Error(err)
			cookie <- 0
			return
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
		if err != nil {
			t.Error(err)
			cookie <- 0
			return
		}
		defer unix.Close(fd)
		c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		if err != nil {
			t.Error(err)
		}
		cookie <- c
	}()
	return nftablesIn(t, fmt.Sprintf("/run/flmbox/egress-router-%d", <-cookie))
}

// flushWorkerRules flushes every nftables rule of w's worker, as `nft flush
// ruleset` (or a reload of a host's nftables.conf) would.
func flushWorkerRules(t *testing.T, w *networld.World) {
	t.Helper()
	c := workerNftables(t, w)
	c.FlushRuleset()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestEgressHeals: an egress sandbox's policy holds when the host's rules
// are flushed (its table is in the egress router, out of their reach): what
// it refused stays refused, what it allowed breaks (the host's masquerade
// went), and the next sandbox command makes the host's part again; a
// suspended one whose namespace, link and table a reboot took resumes with
// its policy, on its addresses.
func TestEgressHeals(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	w := networld.Start(t)
	for _, name := range []string{"flushed", "rebooted"} {
		mustFlmboxIn(t, w, root, "sandbox", "create", "--name", name, "--image", reg.digestRef(), "--network", "egress",
			"--allow", "allowed.test", "--dns", networld.DNSAddr)
		t.Cleanup(func() { flmboxIn(t, w, root, "sandbox", "rm", name) })
	}
	probes := map[string]string{
		"allowed": `get(resolve("allowed.test"))`,
		"other":   `get("198.51.100.11")`,
		"meta":    `get("169.254.169.254")`,
	}
	holds := func(name string) {
		t.Helper()
		got := egressProbes(t, w, root, []string{"--sandbox", name}, probes)
		egressCheck(t, got, map[string]func(string) bool{
			"allowed": egressIs("ok:hello 198.51.100.10 from 198.51.100.10:80"),
			"other":   egressConnRefused,
			"meta":    egressConnRefused,
		})
	}
	holds("flushed")

	flushWorkerRules(t, w)
	got := egressProbes(t, w, root, []string{"--sandbox", "flushed"}, probes)
	egressCheck(t, got, map[string]func(string) bool{
		"allowed": func(r string) bool { return egressFailed(r) && r != "ECONNREFUSED" }, // leaves unmasqueraded: no answer
		"other":   egressConnRefused,
		"meta":    egressConnRefused,
	})
	res := flmboxIn(t, w, root, "sandbox", "ls")
	if res.code != 0 || !strings.Contains(res.stderr, "flmbox-nat") {
		t.Fatalf("sandbox ls after a flush: exit %d, stderr %q", res.code, res.stderr)
	}
	// The link's carrier comes back a moment after it is up.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := egressProbes(t, w, root, []string{"--sandbox", "flushed"}, map[string]string{"allowed": `get(resolve("allowed.test"))`})
		if strings.HasPrefix(got["allowed"], "ok:") || time.Now().After(deadline) {
			break
		}
	}
	holds("flushed")

	// A reboot of a suspended sandbox: its namespace's mount, link and
	// table are gone.
	mustFlmboxIn(t, w, root, "sandbox", "suspend", "rebooted")
	if err := unix.Unmount(filepath.Join(stateroot.Sandbox(root, "rebooted"), "netns"), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	flushWorkerRules(t, w)
	holds("rebooted") // resumed by its call
}

// TestEgressPolicyFollowsTheAnswer: a Deny rule with a port holds through a
// CNAME (www.corp.test is a CNAME of admin.corp.test, whose port 80 is
// denied), and an address a DNS answer gives only in its additional
// section opens nothing: the resolver pins the answer section's addresses
// of the names the answer goes through, and only those.
func TestEgressPolicyFollowsTheAnswer(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "cname", "--allow", "*.corp.test", "--deny", "admin.corp.test:80")
	w.SetA("admin.corp.test", networld.AllowedAddr)
	w.SetCNAME("www.corp.test", "admin.corp.test")
	w.SetA("hint.corp.test", networld.PyPIAddr) // not admin.corp.test's address, whose port 80 is denied
	w.SetExtraA("hint.corp.test", networld.OtherAddr)
	got := egressProbes(t, w, root, []string{"--sandbox", "cname"}, map[string]string{
		"through cname": `get(resolve("www.corp.test"))`,
		"cname's https": `get(resolve("www.corp.test"), 443, host="allowed.test", tls=True)`,
		"hint":          `get(resolve("hint.corp.test"))`,
		"hinted":        `resolve("hint.corp.test") and get("` + networld.OtherAddr + `")`,
	})
	egressCheck(t, got, map[string]func(string) bool{
		"through cname": egressConnRefused,
		"cname's https": func(r string) bool { return strings.HasPrefix(r, "ok:") }, // only port 80 is denied
		"hint":          func(r string) bool { return strings.HasPrefix(r, "ok:") },
		"hinted":        egressConnRefused,
	})
}

// TestEgressForwardingAfterAFlushedRuleset: a flush of the worker's whole
// ruleset takes flmbox's forward guard with the sandbox's table; the next
// sandbox command makes both again, and once the last egress sandbox goes,
// the worker forwards as it did before (not at all), whatever was flushed.
func TestEgressForwardingAfterAFlushedRuleset(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	w := networld.Start(t)
	state := func() networld.State {
		t.Helper()
		s, err := w.WorkerState()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	guarded := func(s networld.State) bool { return slices.Contains(s.Tables, "inet flmbox-forward-guard") }
	if s := state(); s.Forwarding != "0" || guarded(s) {
		t.Fatalf("the worker before any sandbox:\n%s", s)
	}
	for _, flushedAgain := range []bool{false, true} {
		mustFlmboxIn(t, w, root, "sandbox", "create", "--name", "fw", "--image", reg.digestRef(), "--network", "egress",
			"--allow", "allowed.test", "--dns", networld.DNSAddr)
		if s := state(); s.Forwarding != "1" || !guarded(s) {
			t.Fatalf("the worker with an egress sandbox:\n%s", s)
		}
		flushWorkerRules(t, w)
		if s := state(); guarded(s) {
			t.Fatalf("the guard survived a flush of the ruleset:\n%s", s)
		}
		mustFlmboxIn(t, w, root, "sandbox", "ls") // reconciles: the table and the guard again
		if s := state(); s.Forwarding != "1" || !guarded(s) {
			t.Fatalf("the worker after sandbox ls:\n%s", s)
		}
		if flushedAgain {
			flushWorkerRules(t, w)
		}
		mustFlmboxIn(t, w, root, "sandbox", "rm", "fw")
		if s := state(); s.Forwarding != "0" || guarded(s) {
			t.Fatalf("the worker after its last egress sandbox went (flushed again: %v):\n%s", flushedAgain, s)
		}
	}
}

// TestEgressFlushedTableFailsClosed: a flush of an egress sandbox's table
// (nft flush table: its rules go, the table stays) closes the sandbox's
// link at once (its resolver hears of each rule deleted), where it passed
// everything before; the next sandbox command makes the table whole again.
func TestEgressFlushedTableFailsClosed(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "ft", "--allow", "allowed.test")
	service := egressPort(w.ListenWorker(t, "tcp", "0.0.0.0:0")) // a service of the worker's, on every address
	probes := map[string]string{
		"allowed": `get(resolve("allowed.test"))`,
		"other":   `get("` + networld.OtherAddr + `")`,
		"meta":    `get("` + networld.MetadataAddr + `")`,
		"worker":  `get("` + networld.WorkerAddr + `", ` + service + `)`,
	}
	holds := func() {
		t.Helper()
		got := egressProbes(t, w, root, []string{"--sandbox", "ft"}, probes)
		egressCheck(t, got, map[string]func(string) bool{
			"allowed": egressIs("ok:hello 198.51.100.10 from 198.51.100.10:80"),
			"other":   egressConnRefused,
			"meta":    egressConnRefused,
			"worker":  egressConnRefused,
		})
	}
	holds()
	// The worker's whole ruleset flushed: the policy, in the egress
	// router, holds (before, the table went with it, and its resolver had
	// to take the link down; dead, the worker's services stayed open).
	flushWorkerRules(t, w)
	got := egressProbes(t, w, root, []string{"--sandbox", "ft"}, probes)
	egressCheck(t, got, map[string]func(string) bool{
		"allowed": func(r string) bool { return egressFailed(r) && r != "ECONNREFUSED" }, // unmasqueraded
		"other":   egressConnRefused,
		"meta":    egressConnRefused,
		"worker":  egressConnRefused,
	})
	mustFlmboxIn(t, w, root, "sandbox", "ls") // the worker's masquerade again
	holds()
	before, _ := refusedClasses(t, w, root)
	// The sandbox's own table flushed, in the router: its resolver takes
	// its link down at once.
	c := routerNftables(t, w)
	c.FlushTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: sandboxID(t, root, "ft")})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// Nothing passes from the first probe on: the link is down.
	got = egressProbes(t, w, root, []string{"--sandbox", "ft"}, probes)
	for k, r := range got {
		if !egressFailed(r) || r == "ECONNREFUSED" {
			t.Errorf("probe %s with the table flushed: %q, want unreachable", k, r)
		}
	}
	res := flmboxIn(t, w, root, "sandbox", "ls")
	if res.code != 0 || !strings.Contains(res.stderr, "changed") || !strings.Contains(res.stderr, "link") {
		t.Fatalf("sandbox ls after a flush of the table: exit %d, stderr %q", res.code, res.stderr)
	}
	// The link's carrier comes back a moment after it is up.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := egressProbes(t, w, root, []string{"--sandbox", "ft"}, map[string]string{"allowed": probes["allowed"]})
		if strings.HasPrefix(got["allowed"], "ok:") || time.Now().After(deadline) {
			break
		}
	}
	holds()
	// The counts go on from what the flushed table had counted when
	// last read: the table made again started at zero.
	after, _ := refusedClasses(t, w, root)
	for _, class := range []string{"metadata", "host"} {
		if before[class] < 1 || after[class] < before[class]+1 {
			t.Errorf("refusals of class %s: %d before the flush, %d after it and one more", class, before[class], after[class])
		}
	}
}

// TestEgressDNSPartKilledFailsClosed: the resolver's DNS part (the process
// that parses what the sandbox sends) killed, its guard takes the link
// down and leaves: nothing passes, not even the allowed name's address,
// until a sandbox command starts the resolver again.
func TestEgressDNSPartKilledFailsClosed(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "dk", "--allow", "allowed.test")
	allowed := map[string]string{"allowed": `get(resolve("allowed.test"))`}
	if got := egressProbes(t, w, root, []string{"--sandbox", "dk"}, allowed); got["allowed"] != "ok:hello 198.51.100.10 from 198.51.100.10:80" {
		t.Fatalf("before: %q", got["allowed"])
	}
	running := func(comm string) []int {
		s, err := w.WorkerState()
		if err != nil {
			t.Fatal(err)
		}
		var pids []int
		for _, p := range s.Procs {
			pid, c, _ := strings.Cut(p, " ")
			if c == comm {
				n, _ := strconv.Atoi(pid)
				pids = append(pids, n)
			}
		}
		return pids
	}
	dns := running("flmbox-dns")
	if len(dns) != 1 {
		t.Fatalf("DNS parts: %v", dns)
	}
	if err := unix.Kill(dns[0], unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	guardRuns := func() bool {
		return slices.ContainsFunc(resolverProcs(t, root), func(p string) bool { return strings.HasSuffix(p, " flmbox-resolver") })
	}
	for deadline := time.Now().Add(30 * time.Second); guardRuns(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the resolver's guard outlives its DNS part")
		}
	}
	if got := egressProbes(t, w, root, []string{"--sandbox", "dk"}, map[string]string{"allowed": `get("198.51.100.10")`}); !egressFailed(got["allowed"]) || got["allowed"] == "ECONNREFUSED" {
		t.Fatalf("the allowed address with the resolver's DNS part killed: %q, want unreachable", got["allowed"])
	}
	if res := flmboxIn(t, w, root, "sandbox", "ls"); res.code != 0 || !strings.Contains(res.stderr, "resolver") {
		t.Fatalf("sandbox ls: exit %d, stderr %q", res.code, res.stderr)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := egressProbes(t, w, root, []string{"--sandbox", "dk"}, allowed)
		if strings.HasPrefix(got["allowed"], "ok:") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after sandbox ls: %q", got["allowed"])
		}
	}
}

// TestEgressResolverAnswersABurst: 300 questions at once from a sandbox are
// all answered (asked upstream: NXDOMAIN), none SERVFAIL; before, 64 were,
// 204 got SERVFAIL and 32 nothing. A question whose datagram was lost (one
// CI run lost some) is asked again every 2 s, as a stub resolver does.
func TestEgressResolverAnswersABurst(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "burst", "--allow", "*.burst.test")
	out := mustFlmboxIn(t, w, root, "run", "--sandbox", "burst", "--timeout", "2m", "-c", `
import select, socket, struct, time
ns = open("/etc/resolv.conf").read().split()[1]
def query(i):
    name = b"".join(bytes([len(l)]) + l for l in ("n%d.burst.test" % i).encode().split(b"."))
    return struct.pack(">6H", i, 0x0100, 1, 0, 0, 0) + name + b"\0" + struct.pack(">2H", 1, 1)
socks = {}
for i in range(300):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(query(i), (ns, 53))
    socks[s] = i
rcodes, pending, deadline, asked = {}, set(socks), time.time() + 60, time.time()
while pending and time.time() < deadline:
    for s in select.select(list(pending), [], [], 0.5)[0]:
        rc = s.recv(512)[3] & 0xf
        rcodes[rc] = rcodes.get(rc, 0) + 1
        pending.discard(s)
    if time.time() - asked > 2: # a datagram lost on a busy machine: asked again, as a stub resolver does
        for s in pending:
            s.sendto(query(socks[s]), (ns, 53))
        asked = time.time()
print(sorted(rcodes.items()), len(pending))
`)
	if got := strings.TrimSpace(out); got != "[(3, 300)] 0" {
		t.Fatalf("300 questions at once: [(rcode, answers)] unanswered: %s, want all NXDOMAIN", got)
	}
}

// TestEgressResolverAsksItsOwnQuestions: the sandbox's resolver never
// relays a query: an EDNS option (data on its way out), another class, a
// query of 60,000 bytes over TCP reach no upstream server; odd ones are
// refused; an answer is kept for its TTL (asked again, upstream is not).
func TestEgressResolverAsksItsOwnQuestions(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "dq", "--allow", "allowed.test", "--allow", "sub.wild.test")
	got := egressProbes(t, w, root, []string{"--sandbox", "dq"}, map[string]string{
		"option":    `dnsq(nameserver(), "allowed.test", opt=b"secret")`,
		"chaos":     `dnsq(nameserver(), "allowed.test", qclass=3)`,
		"oversized": `dnsq(nameserver(), "allowed.test", tcp=True, opt=b"x" * 60000)`,
		"txt":       `dnsq(nameserver(), "allowed.test", 16)`,
		"twice":     `dnsq(nameserver(), "sub.wild.test") + " " + dnsq(nameserver(), "sub.wild.test", tcp=True)`, // the probes run at once: a name of its own
	})
	egressCheck(t, got, map[string]func(string) bool{
		"option":    egressIs("ok:rcode=0 198.51.100.10"),
		"chaos":     egressIs("ok:rcode=5"),
		"oversized": egressIs("ok:rcode=5"),
		"txt":       egressIs("ok:rcode=0"),
		"twice":     egressIs("ok:rcode=0 " + networld.AllowedAddr + " rcode=0 " + networld.AllowedAddr),
	})
	if n := w.OddQueries(); n != 0 {
		t.Errorf("the world's DNS server had %d odd queries: relayed", n)
	}
	if n := w.Queries("sub.wild.test"); n != 1 {
		t.Errorf("the world's DNS server was asked %d times for sub.wild.test, want 1 (then kept)", n)
	}
}

// TestEgressFlowsAreBounded: a sandbox holds at most 4,096 connections in
// the host's connection tracking: 20,000 UDP datagrams to as many ports of
// an allowed address took the worker's table from some 3,000 entries to
// 19,000 before; now the ones past the bound are refused, untracked.
func TestEgressFlowsAreBounded(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "flows", "--allow", networld.OtherAddr)
	tracked := func() int {
		t.Helper()
		out, err := w.Command(t.Context(), "cat", "/proc/sys/net/netfilter/nf_conntrack_count").Output()
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := tracked()
	res := mustFlmboxIn(t, w, root, "run", "--sandbox", "flows", "-c", `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent = refused = 0
for port in range(10000, 30000):
    try:
        s.sendto(b"x", ("`+networld.OtherAddr+`", port))
        sent += 1
    except OSError:
        refused += 1 # an earlier datagram's refusal, reported on this one
print(sent + refused)
`)
	if strings.TrimSpace(res) != "20000" {
		t.Fatalf("the snippet printed %q", res)
	}
	if after := tracked(); after-before > 4096+256 {
		t.Fatalf("the worker tracks %d connections after 20,000 datagrams, %d before: unbounded", after, before)
	}
}

// TestEgressRefusalsCannotBeBlinded: 5,000 refused ports fill the set of
// refused destinations (4,096), and a refusal to the metadata service after
// them still shows, in its class's count, which never saturates. The counts
// are of packets the firewall saw: a datagram the sandbox's own stack or its
// link drops under the burst never reaches it (18 of 5,000 did not in one CI
// run), so the test asks for more refusals than the set holds, not all 5,000.
func TestEgressRefusalsCannotBeBlinded(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "blind", "--allow", "allowed.test")
	mustFlmboxIn(t, w, root, "run", "--sandbox", "blind", "-c", `
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for port in range(10000, 15000):
    if port % 100 == 0: time.sleep(0.005) # a burst, not a flood the link drops
    while True: # until it is sent: an OSError is an earlier datagram's refusal, reported on this send
        try:
            s.sendto(b"x", ("`+networld.OtherAddr+`", port))
            break
        except OSError: pass
try: socket.create_connection(("`+networld.MetadataAddr+`", 80), timeout=3)
except OSError as e: print(e.errno)
`)
	classes, refused := refusedClasses(t, w, root)
	if classes["metadata"] < 1 || classes["not allowed"] <= 4096 || refused > 4096 {
		t.Fatalf("refused by class %v, %d destinations", classes, refused)
	}
}

// refusedClasses are the counts by class that `sandbox ls --json` shows of
// root's one sandbox, and how many destinations it lists.
func refusedClasses(t *testing.T, w *networld.World, root string) (map[string]int, int) {
	t.Helper()
	var sbs []egressInfo
	out := mustFlmboxIn(t, w, root, "sandbox", "ls", "--json")
	if err := json.Unmarshal([]byte(out), &sbs); err != nil || len(sbs) != 1 || sbs[0].Egress == nil {
		t.Fatalf("sandbox ls --json printed %q: %v", out, err)
	}
	classes := map[string]int{}
	for _, c := range sbs[0].Egress.RefusedClasses {
		classes[c.Class] = c.Count
	}
	return classes, len(sbs[0].Egress.Refused)
}

// TestEgressDeadResolverAndDeletedTableFailClosed: with the sandbox's
// resolver dead (nothing to take its link down) and its table deleted, or
// the worker's whole ruleset flushed, the sandbox's packets go nowhere: the
// worker's routing forwards a packet of a sandbox's address only marked by
// its table. Before, they left (unmasqueraded) until the next sandbox
// command.
func TestEgressDeadResolverAndDeletedTableFailClosed(t *testing.T) {
	t.Parallel()
	w, root := egressSandbox(t, "dead", "--allow", "allowed.test:80")
	echo := networld.AllowedAddr + ":9999"
	send := `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20):
    try: s.sendto(b"leak", ("` + networld.AllowedAddr + `", 9999))
    except OSError: pass
print("sent")
`
	mustFlmboxIn(t, w, root, "run", "--sandbox", "dead", "-c", send)
	if n := w.HitsTo(networld.Echo, echo); n != 0 {
		t.Fatalf("the policy let %d datagrams to %s through", n, echo)
	}
	service := egressPort(w.ListenWorker(t, "tcp", "0.0.0.0:0")) // a service of the worker's, on every address
	killResolver(t, root, "flmbox-resolver")
	c := routerNftables(t, w)
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: sandboxID(t, root, "dead")})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// Nor does the worker's own service answer: its address is one the
	// router forwards to, not one of its own (before, the worker's
	// addresses were local to the sandbox's link, delivered before any
	// routing rule).
	got := egressProbes(t, w, root, []string{"--sandbox", "dead"}, map[string]string{
		"worker": `get("` + networld.WorkerAddr + `", ` + service + `)`,
	})
	if !egressFailed(got["worker"]) {
		t.Fatalf("with its resolver dead and its table deleted, the sandbox reached the worker's service: %q", got["worker"])
	}
	// A call does not reconcile: the sandbox stays as the faults left it.
	mustFlmboxIn(t, w, root, "run", "--sandbox", "dead", "-c", send)
	if n := w.HitsTo(networld.Echo, echo); n != 0 {
		t.Fatalf("with its resolver dead and its table deleted, %d of the sandbox's datagrams reached %s", n, echo)
	}
	flushWorkerRules(t, w)
	mustFlmboxIn(t, w, root, "run", "--sandbox", "dead", "-c", send)
	if n := w.HitsTo(networld.Echo, echo); n != 0 {
		t.Fatalf("with the ruleset flushed too, %d of the sandbox's datagrams reached %s", n, echo)
	}
	// The next sandbox command makes it whole again.
	mustFlmboxIn(t, w, root, "sandbox", "ls")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := egressProbes(t, w, root, []string{"--sandbox", "dead"}, map[string]string{"allowed": `get(resolve("allowed.test"))`})
		if strings.HasPrefix(got["allowed"], "ok:") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's policy is not back after sandbox ls: %v", got)
		}
	}
}

// egressSandbox starts a world of its own and makes egress sandbox name in
// a root of its own, with --dns the world's and flags (its rules), removed
// when t ends.
func egressSandbox(t *testing.T, name string, flags ...string) (w *networld.World, root string) {
	t.Helper()
	reg := startRegistry(t)
	root = sandboxRoot(t, reg)
	w = networld.Start(t)
	args := append([]string{"sandbox", "create", "--name", name, "--image", reg.digestRef(), "--network", "egress", "--dns", networld.DNSAddr}, flags...)
	mustFlmboxIn(t, w, root, args...)
	t.Cleanup(func() { flmboxIn(t, w, root, "sandbox", "rm", name) })
	return w, root
}

// workerNftables is a connection to nftables in w's worker namespace.
func workerNftables(t *testing.T, w *networld.World) *nftables.Conn {
	t.Helper()
	return nftablesIn(t, w.WorkerNetNS())
}

// nftablesIn is a connection to nftables in the network namespace bound at
// path.
func nftablesIn(t *testing.T, path string) *nftables.Conn {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // each of c's requests dials in the namespace by this descriptor
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
