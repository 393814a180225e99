//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/testrig/networld"
)

// Issue 29's --network egress against the real runsc, in a private
// internet (networld): flmbox runs in the world's worker namespace, and no
// probe can send a packet beyond the two namespaces the test makes. Every
// probe runs as the sandbox's user (65534).

// egressInfo is a sandbox's egress counters as sandbox ls --json lists
// them.
type egressInfo struct {
	Name   string `json:"name"`
	Egress *struct {
		Refused []struct {
			Destination string `json:"destination"`
			Port        int    `json:"port"`
			Protocol    string `json:"protocol"`
			Count       int    `json:"count"`
		} `json:"refused"`
		RefusedNames []struct {
			Name  string `json:"name"`
			Count int    `json:"count"`
		} `json:"refused_names"`
		RefusedClasses []struct {
			Class string `json:"class"`
			Count int    `json:"count"`
		} `json:"refused_classes"`
	} `json:"egress"`
}

// egressCounters are the hit counters of the services no egress sandbox
// of TestEgress may reach.
func egressCounters(w *networld.World) string {
	return fmt.Sprintf("metadata %d private %d host %d v6 %d http-to-other %d https-to-other %d echo-9999 %d",
		w.Hits(networld.Metadata), w.Hits(networld.Private), w.Hits(networld.Host), w.Hits(networld.V6),
		w.HitsTo(networld.HTTP, networld.OtherAddr), w.HitsTo(networld.HTTPS, networld.OtherAddr), w.HitsTo(networld.Echo, networld.AllowedAddr+":9999"))
}

func TestEgress(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	w := networld.Start(t)
	before, err := w.WorkerState()
	if err != nil {
		t.Fatal(err)
	}
	w.SetA("wild.test", networld.OtherAddr)        // *.wild.test does not allow wild.test itself
	w.SetAAAA("allowed.test", networld.WorldAddr6) // dropped: a sandbox has no IPv6
	w.AddWheel("nw-greet", "1.0")
	hostPort := egressPort(w.ListenWorker(t, "tcp", "0.0.0.0:0"))
	hostUDPPort := egressPort(w.ListenWorker(t, "udp", "0.0.0.0:0"))
	hostLo := w.ListenWorker(t, "tcp", "127.0.0.1:0")

	// Any user may open an ICMP socket in the worker, so that the
	// control below can ping.
	if out, err := w.Command(t.Context(), "sysctl", "-w", "net.ipv4.ping_group_range=0 2147483647").CombinedOutput(); err != nil {
		t.Fatalf("sysctl in the worker: %v %s", err, out)
	}
	// The probes work: with --network host (the worker's network, in
	// this test) each reaches what egress refuses. Names are not used:
	// the host's /etc/resolv.conf names a real server (a query to it would
	// die in world, which routes nothing).
	control := egressProbes(t, w, root, []string{"--image", reg.digestRef(), "--network", "host"}, map[string]string{
		"dns udp":  `dnsq("192.0.2.53", "allowed.test")`,
		"dns tcp":  `dnsq("192.0.2.53", "allowed.test", tcp=True)`,
		"metadata": `get("169.254.169.254")`,
		"private":  `get("10.77.0.5")`,
		"v6":       `get("fd77::1", family=socket.AF_INET6)`,
		"host":     fmt.Sprintf(`get("203.0.113.2", %s)`, hostPort),
		"echo":     `udp("198.51.100.10", 9999)`,
		"ping":     `ping("198.51.100.10")`,
	})
	t.Logf("--network host (the control): %v", control)
	egressCheck(t, control, map[string]func(string) bool{
		"dns udp": egressIs("ok:rcode=0 198.51.100.10"), "dns tcp": egressIs("ok:rcode=0 198.51.100.10"),
		"metadata": egressIs("ok:SECRET-METADATA"), "private": egressIs("ok:PRIVATE"), "host": egressIs("ok:HOST-SERVICE"),
		"v6": egressIs("ok:hello fd77::1 from [fd77::1]:80"), "echo": egressIs("ok:ping"), "ping": egressIs("ok:reply 14 bytes"),
	})
	counters := egressCounters(w)

	egress := func(name string, rules ...string) {
		args := append([]string{"sandbox", "create", "--name", name, "--image", reg.digestRef(), "--network", "egress", "--dns", networld.DNSAddr}, rules...)
		if got := strings.TrimSpace(mustFlmboxIn(t, w, root, args...)); got != name {
			t.Fatalf("sandbox create printed %q, want %q", got, name)
		}
	}
	names := []string{"names", "cidr", "udp", "suspend"}
	// Before the world goes (cleanups run last first), and in the worker.
	t.Cleanup(func() {
		for _, n := range names {
			flmboxIn(t, w, root, "sandbox", "rm", n)
		}
	})
	egress("names", "--allow", "allowed.test", "--allow", "*.wild.test", "--allow", "private.test", "--allow", "meta.test", "--allow", "pypi.test")
	egress("cidr", "--allow", "198.51.100.0/24", "--deny", networld.OtherAddr)
	egress("udp", "--allow", "allowed.test:7")
	egress("suspend", "--allow", "allowed.test")

	t.Run("policy", func(t *testing.T) {
		t.Run("names", func(t *testing.T) { t.Parallel(); egressNames(t, w, root, hostPort, hostUDPPort, hostLo) })
		t.Run("many", func(t *testing.T) { t.Parallel(); egressMany(t, w, root) })
		t.Run("pip", func(t *testing.T) { t.Parallel(); egressPip(t, w, root) })
		t.Run("cidr", func(t *testing.T) { t.Parallel(); egressCIDR(t, w, root) })
		t.Run("udp", func(t *testing.T) { t.Parallel(); egressUDP(t, w, root) })
		t.Run("fresh", func(t *testing.T) {
			t.Parallel()
			got := egressProbes(t, w, root, []string{"--image", reg.digestRef(), "--network", "egress", "--dns", networld.DNSAddr, "--allow", "allowed.test"},
				map[string]string{"allowed": `get("allowed.test")`, "other": `resolve("other.test")`, "other ip": `get("198.51.100.11")`})
			egressCheck(t, got, map[string]func(string) bool{"allowed": egressIs("ok:hello allowed.test from 198.51.100.10:80"), "other": egressNXDomain, "other ip": egressFailed})
		})
		t.Run("suspend", func(t *testing.T) { t.Parallel(); egressSuspend(t, w, root) })
	})

	if after := egressCounters(w); after != counters {
		t.Errorf("egress sandboxes reached services they may not:\nbefore %s\nafter  %s", counters, after)
	}
	// The resolver answers denied names itself: a denied name never
	// leaves the host (a way out for data otherwise).
	for _, n := range []string{"other.test", "exfil-c2VjcmV0.other.test", "wild.test"} {
		if q := w.Queries(n); q != 0 {
			t.Errorf("the world's DNS server was asked %d times for %s, a name no sandbox may resolve", q, n)
		}
	}
	egressResolverUnprivileged(t, root)
	egressCounted(t, w, root)

	for _, n := range names {
		mustFlmboxIn(t, w, root, "sandbox", "rm", n)
	}
	// Removal is synchronous, but the kernel frees a network namespace
	// (and with it a veth's end) a moment after its last user goes.
	if after, ok := egressStateBack(t, w, before); !ok {
		t.Errorf("sandbox rm left state behind in the worker:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// egressPort is addr's port.
func egressPort(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// egressCounted checks that sandbox ls --json counts what the names
// sandbox was refused.
func egressCounted(t *testing.T, w *networld.World, root string) {
	var sbs []egressInfo
	out := mustFlmboxIn(t, w, root, "sandbox", "ls", "--json")
	if err := json.Unmarshal([]byte(out), &sbs); err != nil {
		t.Fatalf("sandbox ls --json printed %q: %v", out, err)
	}
	for _, sb := range sbs {
		if sb.Name != "names" {
			continue
		}
		if sb.Egress == nil {
			t.Fatalf("sandbox ls --json has no egress for sandbox names: %s", out)
		}
		tcp, name := 0, 0
		for _, r := range sb.Egress.Refused {
			if r.Destination == networld.OtherAddr && r.Port == 80 && r.Protocol == "tcp" {
				tcp = r.Count
			}
		}
		for _, r := range sb.Egress.RefusedNames {
			if r.Name == "other.test" {
				name = r.Count
			}
		}
		// The names probes connect to 198.51.100.11:80 once and ask
		// for other.test at least twice (getaddrinfo and dnsq).
		if tcp < 1 || name < 2 {
			t.Errorf("sandbox ls --json counts %d refused connections to %s:80/tcp and %d refused names other.test:\n%s", tcp, networld.OtherAddr, name, out)
		}
		t.Logf("sandbox names's egress: %+v", *sb.Egress)
		return
	}
	t.Fatalf("sandbox ls --json does not list sandbox names: %s", out)
}
