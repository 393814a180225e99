//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/testrig/networld"
)

// flmboxIn runs flmbox with --root root in w's worker network namespace
// (and the host's mount namespace), as flmbox does.
func flmboxIn(t testing.TB, w *networld.World, root string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := w.Command(ctx, flmboxBin, append([]string{"--root", root, "--runsc", runscPath}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run flmbox %v in the worker: %v", args, err)
	}
	return res
}

// mustFlmboxIn is flmboxIn, failing the test unless flmbox exits 0.
func mustFlmboxIn(t testing.TB, w *networld.World, root string, args ...string) string {
	t.Helper()
	res := flmboxIn(t, w, root, args...)
	if res.code != 0 {
		t.Fatalf("flmbox %v (in the worker): exit %d\nstdout: %s\nstderr: %s", args, res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// egressProbes runs, in sandbox name (or with --image and args, in a fresh
// one), probes: Python expressions, each evaluated after egressPrelude on
// a thread of its own, all at once. It returns each one's result: "ok:"
// and what it returned, or how it failed (fail below).
func egressProbes(t testing.TB, w *networld.World, root string, args []string, probes map[string]string) map[string]string {
	t.Helper()
	var code strings.Builder
	fmt.Fprintf(&code, egressPrelude, string(w.CAPEM()))
	code.WriteString("probe({\n")
	for k, v := range probes {
		fmt.Fprintf(&code, "    %q: lambda: %s,\n", k, v)
	}
	code.WriteString("})\n")
	res := flmboxIn(t, w, root, append(append([]string{"run", "--timeout", "120s"}, args...), "-c", code.String())...)
	var got map[string]string
	if err := json.Unmarshal([]byte(res.stdout), &got); res.code != 0 || err != nil {
		t.Fatalf("probes: exit %d stdout %q stderr %q: %v", res.code, res.stdout, res.stderr, err)
	}
	return got
}

// egressStateBack polls w's worker until its state is before again, for
// up to 10 s (the kernel frees a network namespace, and with it a veth's
// end, a moment after its last user goes), and returns the last state read.
func egressStateBack(t testing.TB, w *networld.World, before networld.State) (networld.State, bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		after, err := w.WorkerState()
		if err != nil {
			t.Fatal(err)
		}
		if after.String() == before.String() {
			return after, true
		}
		if time.Now().After(deadline) {
			return after, false
		}
	}
}

// egressCheck fails t for each probe whose result does not satisfy want.
func egressCheck(t testing.TB, got map[string]string, want map[string]func(string) bool) {
	t.Helper()
	for k, ok := range want {
		if !ok(got[k]) {
			t.Errorf("probe %s: %q", k, got[k])
		}
	}
}

// Result predicates.
var (
	// egressFailed: any failure (a refusal, an unreachable network, a timeout).
	egressFailed = func(r string) bool { return r != "" && !strings.HasPrefix(r, "ok") }
	// egressConnRefused: a TCP connect the host's table refused, at once
	// (a reset).
	egressConnRefused = func(r string) bool { return r == "ECONNREFUSED" }
	// egressNXDomain: getaddrinfo's EAI_NONAME, what an NXDOMAIN answer gives.
	egressNXDomain = func(r string) bool { return r == "gai:-2" }
	// egressNoAddress: the name does not resolve to an address (NXDOMAIN, or an
	// answer without addresses: EAI_NODATA, or glibc's EAI_NONAME).
	egressNoAddress = func(r string) bool { return r == "gai:-2" || r == "gai:-5" }
)

// egressIs returns a predicate true of exactly want.
func egressIs(want string) func(string) bool { return func(r string) bool { return r == want } }

// egressPrelude defines the probes' helpers; %s is the world's CA.
const egressPrelude = `
import concurrent.futures, errno, json, os, shutil, socket, ssl, struct, subprocess, sys
CA = """%s"""
T = 3.0

def fail(e):
    if isinstance(e, socket.gaierror): return "gai:%%d" %% e.args[0]
    if isinstance(e, (socket.timeout, TimeoutError)): return "timeout"
    if isinstance(e, ssl.SSLError): return "ssl:" + str(e.reason)
    if isinstance(e, OSError) and e.errno: return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__ + ":" + str(e)

def resolve(name, family=socket.AF_UNSPEC):
    return " ".join(sorted({a[4][0] for a in socket.getaddrinfo(name, 80, family, socket.SOCK_STREAM)}))

def conn(addr, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(T)
    s.connect((addr, port))
    return s

def get(addr, port=80, host=None, path="/", tls=False, sni=None, family=socket.AF_INET):
    s = conn(addr, port, family)
    if tls:
        s = ssl.create_default_context(cadata=CA).wrap_socket(s, server_hostname=sni or host or addr)
    with s:
        s.sendall(("GET %%s HTTP/1.0\r\nHost: %%s\r\n\r\n" %% (path, host or addr)).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk: break
            data += chunk
    return data.split(b"\r\n\r\n", 1)[1].decode()

def udp(addr, port, payload=b"ping"):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(T)
        s.sendto(payload, (addr, port))
        return s.recv(100).decode()

def recvall(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c: raise EOFError("short read")
        b += c
    return b

def skipname(r, i):
    while r[i]:
        if r[i] & 0xc0 == 0xc0: return i + 2
        i += 1 + r[i]
    return i + 1

def dnsq(server, name, qtype=1, tcp=False, qclass=1, opt=None):
    q = struct.pack("!HHHHHH", 0x2929, 0x0100, 1, 0, 0, 1 if opt is not None else 0) + b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack("!HH", qtype, qclass)
    if opt is not None: # an EDNS record with one option (code 65001) holding opt
        q += b"\0" + struct.pack("!HHIH", 41, 1232, 0, 4 + len(opt)) + struct.pack("!HH", 65001, len(opt)) + opt
    if tcp:
        with conn(server, 53) as s:
            s.sendall(struct.pack("!H", len(q)) + q)
            r = recvall(s, struct.unpack("!H", recvall(s, 2))[0])
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(T)
            s.sendto(q, (server, 53))
            r = s.recv(4096)
    i, addrs = skipname(r, 12) + 4, []
    for _ in range(struct.unpack("!H", r[6:8])[0]):
        i = skipname(r, i)
        typ, _, _, n = struct.unpack("!HHIH", r[i:i + 10])
        i += 10
        if typ in (1, 28): addrs.append(socket.inet_ntop(socket.AF_INET if typ == 1 else socket.AF_INET6, r[i:i + n]))
        i += n
    return " ".join(["rcode=%%d" %% (r[3] & 15)] + addrs)

def ping(addr, kind=socket.SOCK_DGRAM):
    try:
        s = socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP)
    except OSError as e:
        return "socket " + fail(e)
    with s:
        s.settimeout(T)
        body = struct.pack("!BBHHH", 8, 0, 0, 0x2929, 1) + b"flmbox"
        csum = sum(struct.unpack("!%%dH" %% (len(body) // 2), body))
        csum = (csum >> 16) + (csum & 0xffff)
        body = body[:2] + struct.pack("!H", ~(csum + (csum >> 16)) & 0xffff) + body[4:]
        s.sendto(body, (addr, 0))
        return "reply %%d bytes" %% len(s.recv(1024))

def nameserver():
    return [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]

def gateway():
    for l in open("/proc/net/route").read().splitlines()[1:]:
        f = l.split()
        if f[1] == "00000000": return socket.inet_ntoa(struct.pack("<I", int(f[2], 16)))
    raise OSError(errno.ENOENT, "no default route")

def many(addr, port, n, host):
    import asyncio
    async def one():
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(addr, port), 10)
            w.write(("GET / HTTP/1.0\r\nHost: %%s\r\n\r\n" %% host).encode())
            data = await asyncio.wait_for(r.read(), 10)
            w.close()
            return "served" if data.endswith(b"from " + addr.encode() + b":80") else "odd"
        except Exception as e:
            return fail(e)
    async def all():
        return await asyncio.gather(*[one() for _ in range(n)])
    res = asyncio.run(all())
    return json.dumps({k: res.count(k) for k in sorted(set(res))}, sort_keys=True)

def child(code):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    return (p.stdout + p.stderr).strip()

def probe(probes):
    def run(f):
        try:
            return "ok:" + str(f())
        except Exception as e:
            return fail(e)
    with concurrent.futures.ThreadPoolExecutor(max_workers=24) as ex:
        futs = {k: ex.submit(run, f) for k, f in probes.items()}
    print(json.dumps({k: f.result() for k, f in futs.items()}))
`
