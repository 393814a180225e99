package networld

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// startWorld starts a world, or skips the test with why if it cannot.
func startWorld(t *testing.T) *World {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("networld's tests make network namespaces: run them as root")
	}
	return Start(t)
}

func TestWorkerSeesOnlyTheWorld(t *testing.T) {
	t.Parallel()
	w := startWorld(t)
	s, err := w.WorkerState()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Links, ","); got != "eth0 veth,lo device" {
		t.Errorf("worker's links: %s, want lo and one veth", got)
	}
	defaults := 0
	for _, r := range s.Routes {
		// Table 254 is main, 255 local (the addresses of the worker).
		if !strings.Contains(r, "dev eth0") && !strings.HasPrefix(r, "table 255 dev lo") {
			t.Errorf("a route not via the uplink: %s", r)
		}
		if strings.Contains(r, "Dst: 0.0.0.0/0") || strings.Contains(r, "Dst: ::/0") {
			defaults++
			if !strings.Contains(r, "Gw: "+GatewayAddr) {
				t.Errorf("a default route not via world: %s", r)
			}
		}
	}
	if defaults != 1 {
		t.Errorf("%d default routes in the worker, want 1:\n%s", defaults, s)
	}
	if len(s.Procs) != 0 {
		t.Errorf("processes in a new worker: %v", s.Procs)
	}
	if len(s.Tables) != 0 {
		t.Errorf("nftables tables in a new worker: %v", s.Tables)
	}
	// Command runs in the worker's network namespace, and no other.
	out, err := w.Command(context.Background(), "readlink", "/proc/self/ns/net", "/proc/self/ns/mnt").Output()
	if err != nil {
		t.Fatal(err)
	}
	var want [2]syscall.Stat_t
	syscall.Stat(w.WorkerNetNS(), &want[0])
	syscall.Stat("/proc/self/ns/mnt", &want[1])
	if got := strings.Fields(string(out)); len(got) != 2 || !strings.HasSuffix(got[0], ":["+strconv.FormatUint(want[0].Ino, 10)+"]") || !strings.HasSuffix(got[1], ":["+strconv.FormatUint(want[1].Ino, 10)+"]") {
		t.Errorf("Command's namespaces: %q, want net inode %d and this process's mount namespace %d", out, want[0].Ino, want[1].Ino)
	}
	// WorkerState sees a process left in the worker.
	sleep := w.Command(context.Background(), "sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Wait()
	defer sleep.Process.Kill()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s, err := w.WorkerState()
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Procs) == 1 && strings.HasSuffix(s.Procs[0], " sleep") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes in the worker: %v, want sleep", s.Procs)
		}
	}
	if _, err := w.DialWorker(context.Background(), "tcp", "allowed.test:80"); err == nil {
		t.Error("DialWorker dialed a name")
	}
}

func TestWorkerReachesEveryServer(t *testing.T) {
	t.Parallel()
	w := startWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := w.WorkerResolver()
	w.SetA("extra.test", "198.51.100.11", "198.51.100.10")
	for name, want := range map[string]string{
		"allowed.test": AllowedAddr, "other.test": OtherAddr, "pypi.test": PyPIAddr, "private.test": PrivateAddr,
		"meta.test": MetadataAddr, "sub.wild.test": AllowedAddr, "v6.test": WorldAddr6, "extra.test": "198.51.100.11 198.51.100.10",
	} {
		ips, err := r.LookupHost(ctx, name)
		if err != nil || strings.Join(ips, " ") != want {
			t.Errorf("resolve %s: %v %v, want %s", name, ips, err, want)
		}
	}
	var dnsErr *net.DNSError
	if _, err := r.LookupHost(ctx, "denied.test"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Errorf("resolve denied.test: %v, want NXDOMAIN", err)
	}
	if w.Queries("allowed.test") == 0 || w.Queries("denied.test") == 0 || w.Queries("nobody.test") != 0 {
		t.Errorf("queries: allowed %d denied %d nobody %d", w.Queries("allowed.test"), w.Queries("denied.test"), w.Queries("nobody.test"))
	}
	// DNS over TCP.
	c, err := w.DialWorker(ctx, "tcp", DNSAddr+":53")
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("other.test.", dns.TypeA)
	co := &dns.Conn{Conn: c}
	if err := co.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	if in, err := co.ReadMsg(); err != nil || len(in.Answer) != 1 || in.Answer[0].(*dns.A).A.String() != OtherAddr {
		t.Errorf("DNS over TCP: %v %v", in, err)
	}
	c.Close()

	wheel := w.AddWheel("nw-test", "1.0")
	hostTCP := w.ListenWorker(t, "tcp", "127.0.0.1:0")
	hostUplink := w.ListenWorker(t, "tcp", WorkerAddr+":0")
	client := w.WorkerClient()
	for url, want := range map[string]string{
		"http://allowed.test/":             "hello allowed.test from 198.51.100.10:80",
		"http://other.test/":               "hello other.test from 198.51.100.11:80",
		"https://allowed.test/":            "tls allowed.test host allowed.test",
		"https://sub.wild.test/x":          "tls sub.wild.test host sub.wild.test",
		"http://meta.test/":                "SECRET-METADATA",
		"http://10.77.0.5/":                "PRIVATE",
		"http://v6.test/":                  "hello v6.test from [fd77::1]:80",
		"http://pypi.test/simple/":         "<a href=\"nw-test/\">nw-test</a>",
		"http://pypi.test/simple/nw_test/": wheel,
		"http://" + hostTCP + "/":          "HOST-SERVICE",
		"http://" + hostUplink + "/":       "HOST-SERVICE",
	} {
		resp, err := client.Get(url)
		if err != nil {
			t.Errorf("GET %s: %v", url, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %q, want %q", url, b, want)
		}
	}
	resp, err := client.Get("http://pypi.test/bytes/1048576")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := io.Copy(io.Discard, resp.Body); n != 1<<20 || err != nil {
		t.Errorf("/bytes/1048576: %d bytes, %v", n, err)
	}
	resp.Body.Close()

	for _, port := range []string{"7", "9999"} {
		c, err := w.DialWorker(ctx, "udp", AllowedAddr+":"+port)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("ping " + port))
		buf := make([]byte, 100)
		if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping "+port {
			t.Errorf("UDP echo on %s: %q %v", port, buf[:n], err)
		}
		c.Close()
	}
	hostUDP := w.ListenWorker(t, "udp", "127.0.0.1:0")
	if c, err := w.DialWorker(ctx, "udp", hostUDP); err != nil {
		t.Fatal(err)
	} else {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("x"))
		buf := make([]byte, 100)
		if n, err := c.Read(buf); err != nil || string(buf[:n]) != "HOST-SERVICE" {
			t.Errorf("UDP host service: %q %v", buf[:n], err)
		}
		c.Close()
	}

	for _, h := range []struct {
		s        Service
		from, to string
		want     int
	}{
		{HTTP, WorkerAddr, AllowedAddr, 1}, {HTTP, WorkerAddr, PyPIAddr, 3}, {HTTPS, WorkerAddr, AllowedAddr, 2},
		{PyPI, WorkerAddr, PyPIAddr, 2}, {Metadata, WorkerAddr, MetadataAddr, 1}, {Private, WorkerAddr, PrivateAddr, 1},
		{V6, WorkerAddr6, WorldAddr6, 1}, {Echo, WorkerAddr, AllowedAddr + ":9999", 1}, {Host, "127.0.0.1", "127.0.0.1", 2},
	} {
		if got := w.HitsTo(h.s, h.to); got != h.want || w.HitsFrom(h.s, h.from) < h.want {
			t.Errorf("%s: %d hits to %s, want %d; %d from %s", h.s, got, h.to, h.want, w.HitsFrom(h.s, h.from), h.from)
		}
	}
	if w.Hits(DNS) == 0 {
		t.Error("no DNS hit counted")
	}
}

func TestStartLeavesNothingBehind(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("networld's tests make network namespaces: run them as root")
	}
	var paths []string
	t.Run("world", func(t *testing.T) {
		w := Start(t)
		w.ListenWorker(t, "tcp", "127.0.0.1:0")
		paths = []string{w.WorkerNetNS(), w.WorldNetNS()}
	})
	for _, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, p := range paths {
		if strings.Contains(string(mounts), p) || strings.Contains(string(out), p[len(netnsDir)+1:]) {
			t.Errorf("%s is still mounted or listed by ip netns:\n%s", p, out)
		}
	}
}
