//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/testrig/networld"
)

// TestEgress's cases, each on the sandboxes it created. A name rule allows
// the addresses the sandbox's resolver answered for the name, so a probe
// resolves a name before it connects to its address.

// egressTricks runs as a child of a probe: what a snippet may try to get
// around the policy from inside, and a connection to a denied address
// after it all. It prints a JSON object.
const egressTricks = `
import ctypes, json, os, shutil, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def unshare(flags):
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    return "unshared"
def t(f):
    try: return str(f())
    except Exception as e: return type(e).__name__ + " " + str(getattr(e, "errno", ""))
out = {}
out["raw"] = t(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) and "made")
out["packet"] = t(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW) and "made")
out["mark"] = t(lambda: socket.socket().setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 1) or "set")
out["ip"] = t(lambda: shutil.which("ip") and subprocess.run(["ip", "route", "replace", "198.51.100.11/32", "dev", "eth0"], capture_output=True, text=True).stderr.strip())
out["userns"] = t(lambda: unshare(0x10000000)) # CLONE_NEWUSER (os.unshare is Python 3.12's)
out["raw in userns"] = t(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) and "made")
out["mark in userns"] = t(lambda: socket.socket().setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 1) or "set")
def connect():
    s = socket.create_connection(("198.51.100.11", 80), timeout=3)
    s.close()
    return "connected"
out["denied after"] = t(connect)
print(json.dumps(out))
`

func egressNames(t *testing.T, w *networld.World, root, hostPort, hostUDPPort, hostLo string) {
	got := egressProbes(t, w, root, []string{"--sandbox", "names"}, egressNamesProbes(hostPort, hostUDPPort, egressPort(hostLo)))
	t.Logf("names: %v", got)
	egressCheck(t, got, map[string]func(string) bool{
		"allowed":          egressIs("ok:198.51.100.10"),
		"allowed http":     egressIs("ok:hello allowed.test from 198.51.100.10:80"),
		"allowed https":    egressIs("ok:tls allowed.test host allowed.test"),
		"allowed aaaa":     egressIs("ok:rcode=0"), // the AAAA fd77::1 is dropped: no IPv6
		"wildcard https":   egressIs("ok:tls sub.wild.test host sub.wild.test"),
		"wild itself":      egressNXDomain,
		"other":            egressNXDomain,
		"other dnsq":       egressIs("ok:rcode=3"),
		"allowed dnsq tcp": egressIs("ok:rcode=0 198.51.100.10"), // DNS over TCP to its resolver
		"exfil":            egressNXDomain,
		"other ip":         egressConnRefused,
		"other ip https":   egressFailed,
		"private":          egressNoAddress,
		"private dnsq":     func(r string) bool { return strings.HasPrefix(r, "ok:rcode=") && !strings.Contains(r, "10.77.0.5") },
		"private ip":       egressConnRefused,
		"meta":             egressNoAddress,
		"meta ip":          egressConnRefused,
		"v6 connect":       egressFailed,
		"dns udp":          egressFailed,
		"dns tcp":          egressConnRefused,
		"dns world":        egressFailed,
		"ping":             func(r string) bool { return !strings.HasPrefix(r, "ok:reply") },
		"ping raw":         func(r string) bool { return !strings.HasPrefix(r, "ok:reply") },
		"ping resolver":    func(r string) bool { return !strings.HasPrefix(r, "ok:reply") },
		"echo 7":           egressIs("ok:ping"),
		"host uplink":      egressConnRefused,
		"host resolver":    egressConnRefused,
		"host loopback":    egressConnRefused,
		"host udp":         egressFailed,
		"write resolv":     egressFailed,
		"tricks": func(r string) bool {
			return strings.Contains(r, `"denied after": "`) && !strings.Contains(r, `"denied after": "connected"`)
		},
	})
	// /proc/net/route may be missing in gVisor: the gateway's probes are
	// then moot, not passed.
	if strings.HasPrefix(got["gateway"], "ok:") {
		egressCheck(t, got, map[string]func(string) bool{
			"host gateway": egressFailed, "host udp gw": egressFailed,
			"not on the uplink": egressIs("ok:True"),
		})
	} else {
		t.Logf("no default route in /proc/net/route (%s): the sandbox's gateway was not probed", got["gateway"])
	}
	// An allowed name's address with another name in SNI and Host: the
	// policy is by address, so this reaches the allowed address's server,
	// which answers for the other name (domain fronting, as on a CDN).
	t.Logf("allowed.test's address with SNI and Host other.test: %s", got["sni"])
}

// egressNamesProbes are the probes of sandbox names, which allows
// allowed.test, *.wild.test, private.test, meta.test and pypi.test; the
// worker serves HOST-SERVICE on 0.0.0.0:hostPort (TCP) and :hostUDPPort
// (UDP), and on 127.0.0.1:loPort.
func egressNamesProbes(hostPort, hostUDPPort, loPort string) map[string]string {
	return map[string]string{
		"nameserver":        `nameserver()`,
		"gateway":           `gateway()`,
		"allowed":           `resolve("allowed.test")`,
		"allowed http":      `get("allowed.test")`,
		"allowed https":     `get("allowed.test", 443, tls=True)`,
		"allowed aaaa":      `dnsq(nameserver(), "allowed.test", 28)`,
		"wildcard https":    `get("sub.wild.test", 443, tls=True)`,
		"wild itself":       `resolve("wild.test")`,
		"other":             `resolve("other.test")`,
		"other dnsq":        `dnsq(nameserver(), "other.test")`,
		"allowed dnsq tcp":  `dnsq(nameserver(), "allowed.test", tcp=True)`,
		"exfil":             `resolve("exfil-c2VjcmV0.other.test")`,
		"other ip":          `get("198.51.100.11", host="other.test")`,
		"other ip https":    `get("198.51.100.11", 443, host="other.test", tls=True)`,
		"sni":               `get(resolve("allowed.test"), 443, host="other.test", tls=True)`,
		"private":           `resolve("private.test")`,
		"private dnsq":      `dnsq(nameserver(), "private.test")`,
		"private ip":        `get("10.77.0.5")`,
		"meta":              `resolve("meta.test")`,
		"meta ip":           `get("169.254.169.254")`,
		"v6 connect":        `get("fd77::1", family=socket.AF_INET6)`,
		"dns udp":           `dnsq("192.0.2.53", "allowed.test")`,
		"dns tcp":           `dnsq("192.0.2.53", "allowed.test", tcp=True)`,
		"dns world":         `dnsq("203.0.113.1", "allowed.test")`,
		"ping":              `ping(resolve("allowed.test"))`,
		"ping raw":          `ping(resolve("allowed.test"), socket.SOCK_RAW)`,
		"ping resolver":     `ping(nameserver())`,
		"echo 7":            `udp(resolve("allowed.test"), 7)`,
		"host uplink":       fmt.Sprintf(`get("203.0.113.2", %s)`, hostPort),
		"host gateway":      fmt.Sprintf(`get(gateway(), %s)`, hostPort),
		"host resolver":     fmt.Sprintf(`get(nameserver(), %s)`, hostPort),
		"host loopback":     fmt.Sprintf(`get("127.0.0.1", %s)`, loPort),
		"host udp":          fmt.Sprintf(`udp("203.0.113.2", %s)`, hostUDPPort),
		"host udp gw":       fmt.Sprintf(`udp(gateway(), %s)`, hostUDPPort),
		"write resolv":      `open("/etc/resolv.conf", "a").write("nameserver 192.0.2.53\n")`,
		"tricks":            "child(" + egressPyString(egressTricks) + ")",
		"not on the uplink": `gateway() != "203.0.113.1"`,
	}
}

// egressPyString quotes s as a Python string literal (JSON's quoting is a
// subset of Python's).
func egressPyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func egressMany(t *testing.T, w *networld.World, root string) {
	got := egressProbes(t, w, root, []string{"--sandbox", "names"}, map[string]string{
		"allowed": `many(resolve("allowed.test"), 80, 200, "allowed.test")`,
		"denied":  `many("198.51.100.11", 80, 200, "other.test")`,
	})
	t.Logf("200 connections at once: %v", got)
	if got["allowed"] != `ok:{"served": 200}` {
		t.Errorf("200 connections to allowed.test: %s, want all served", got["allowed"])
	}
	var denied map[string]int
	if err := json.Unmarshal([]byte(strings.TrimPrefix(got["denied"], "ok:")), &denied); err != nil {
		t.Fatalf("200 connections to other.test's address: %s", got["denied"])
	}
	n := 0
	for k, c := range denied {
		if k == "served" || k == "odd" {
			t.Errorf("%d of 200 connections to other.test's address got through: %s", c, got["denied"])
		}
		n += c
	}
	if n != 200 {
		t.Errorf("200 connections to other.test's address: %s", got["denied"])
	}
}

func egressPip(t *testing.T, w *networld.World, root string) {
	// pip ignores an index over plain HTTP unless the host is trusted.
	out := mustFlmboxIn(t, w, root, "run", "--sandbox", "names", "-l", "shell", "--timeout", "120s", "-c",
		"python3 -m pip install --quiet --index-url http://pypi.test/simple/ --trusted-host pypi.test nw-greet && python3 -c 'import nw_greet; print(nw_greet.GREETING)'")
	if !strings.HasSuffix(out, "hello from nw-greet 1.0\n") {
		t.Errorf("pip install from pypi.test: %q", out)
	}
	if w.Hits(networld.PyPI) == 0 {
		t.Error("the index on pypi.test had no request")
	}
}

func egressCIDR(t *testing.T, w *networld.World, root string) {
	got := egressProbes(t, w, root, []string{"--sandbox", "cidr"}, map[string]string{
		"in range":  `get("198.51.100.10")`,
		"in range2": `get("198.51.100.12", host="pypi.test")`,
		"denied":    `get("198.51.100.11")`,
		"dns udp":   `dnsq("192.0.2.53", "allowed.test")`,
		"dns tcp":   `dnsq("192.0.2.53", "other.test", tcp=True)`,
		"name":      `resolve("allowed.test")`,
		"metadata":  `get("169.254.169.254")`,
		"private":   `get("10.77.0.5")`,
	})
	t.Logf("cidr: %v", got)
	egressCheck(t, got, map[string]func(string) bool{
		"in range":  egressIs("ok:hello 198.51.100.10 from 198.51.100.10:80"),
		"in range2": egressIs("ok:hello pypi.test from 198.51.100.12:80"),
		"denied":    egressConnRefused,
		// The world's DNS server is outside the allowed range.
		"dns udp":  egressFailed,
		"dns tcp":  egressConnRefused,
		"name":     egressNXDomain, // no name rule
		"metadata": egressFailed,
		"private":  egressConnRefused,
	})
}

func egressUDP(t *testing.T, w *networld.World, root string) {
	got := egressProbes(t, w, root, []string{"--sandbox", "udp"}, map[string]string{
		"echo 7":    `udp(resolve("allowed.test"), 7)`,
		"echo 9999": `udp(resolve("allowed.test"), 9999)`,
		"tcp 80":    `get(resolve("allowed.test"))`,
	})
	t.Logf("udp: %v", got)
	egressCheck(t, got, map[string]func(string) bool{"echo 7": egressIs("ok:ping"), "echo 9999": egressFailed, "tcp 80": egressFailed})
}

func egressSuspend(t *testing.T, w *networld.World, root string) {
	probes := map[string]string{"allowed": `get("allowed.test")`, "other": `resolve("other.test")`, "other ip": `get("198.51.100.11")`}
	want := map[string]func(string) bool{"allowed": egressIs("ok:hello allowed.test from 198.51.100.10:80"), "other": egressNXDomain, "other ip": egressFailed}
	egressCheck(t, egressProbes(t, w, root, []string{"--sandbox", "suspend"}, probes), want)
	mustFlmboxIn(t, w, root, "sandbox", "suspend", "suspend")
	var sbs []sandboxEntry
	if err := json.Unmarshal([]byte(mustFlmboxIn(t, w, root, "sandbox", "ls", "--json")), &sbs); err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.Name == "suspend" && sb.State != "suspended" {
			t.Fatalf("sandbox suspend is %s after sandbox suspend", sb.State)
		}
	}
	// run --sandbox resumes it, with the same policy.
	got := egressProbes(t, w, root, []string{"--sandbox", "suspend"}, probes)
	t.Logf("after resume: %v", got)
	egressCheck(t, got, want)
}
