package egress

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// TestConfineParser: confined, the DNS part does its work (a DNS server
// and client over UDP and TCP, files in its directory, goroutines, timers,
// the garbage collector) and cannot run a program, open a netlink socket,
// signal another process, trace or mount. The test runs itself again as
// the confined process.
func TestConfineParser(t *testing.T) {
	if os.Getenv("EGRESS_TEST_CONFINED") == "1" {
		confinedWork(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConfineParser$", "-test.v")
	cmd.Env = append(os.Environ(), "EGRESS_TEST_CONFINED=1", "EGRESS_TEST_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestConfineParser") {
		t.Fatalf("the confined process: %v\n%s", err, out)
	}
}

func confinedWork(t *testing.T) {
	dir, err := os.Open(os.Getenv("EGRESS_TEST_DIR"))
	if err != nil {
		t.Fatal(err)
	}
	// Its listeners are bound before, as the resolver's are by its other part.
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := confineParser(); err != nil {
		t.Fatal(err)
	}
	refused := map[string]error{}
	if err := syscall.Exec("/bin/true", []string{"true"}, nil); err != nil {
		refused["execve"] = err
	}
	if _, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER); err != nil {
		refused["netlink socket"] = err
	}
	if _, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0); err != nil {
		refused["packet socket"] = err
	}
	if err := unix.Kill(1, 0); err != nil {
		refused["kill"] = err
	}
	if err := unix.Tgkill(1, 1, 0); err != nil {
		refused["tgkill of another"] = err
	}
	if err := unix.PtraceAttach(1); err != nil {
		refused["ptrace"] = err
	}
	if err := unix.Mount("none", "/mnt", "tmpfs", 0, ""); err != nil {
		refused["mount"] = err
	}
	if _, _, e := unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0); e != 0 {
		refused["unshare"] = e
	}
	if _, _, e := unix.RawSyscall(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0); e != 0 {
		refused["fork"] = e // a child would return here: the filter must say no
	}
	for _, what := range []string{"execve", "netlink socket", "packet socket", "kill", "tgkill of another", "ptrace", "mount", "unshare", "fork"} {
		if refused[what] != unix.EPERM {
			t.Errorf("%s: %v, want EPERM", what, refused[what])
		}
	}
	// The work: a DNS server, asked over UDP and TCP; a file written.
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A: netip.MustParseAddr("198.51.100.1").AsSlice()})
		w.WriteMsg(m)
	})
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		go s.ActivateAndServe()
		defer s.Shutdown()
	}
	for i := range 200 {
		c := &dns.Client{Net: []string{"udp", "tcp"}[i%2], Timeout: 5 * time.Second}
		m, _, err := c.Exchange(new(dns.Msg).SetQuestion("a.test.", dns.TypeA), pc.LocalAddr().String())
		if err != nil || len(m.Answer) != 1 {
			t.Fatalf("exchange %d over %s: %v", i, c.Net, err)
		}
		if i%50 == 0 {
			runtime.GC()
			if err := writeAt(dir, "refused.json", []byte("[]")); err != nil {
				t.Fatal(err)
			}
			if _, err := readRefused(dir, "refused.json"); err != nil {
				t.Fatal(err)
			}
		}
	}
	done := make(chan bool)
	for range 50 {
		go func() { time.Sleep(time.Millisecond); done <- true }()
	}
	for range 50 {
		<-done
	}
}

// TestGuardChecksWhatItPins: the privileged part pins nothing the policy
// refuses, whatever the DNS part (which parses hostile input) asks.
func TestGuardChecksWhatItPins(t *testing.T) {
	g := &guard{cfg: ResolverConfig{Table: "none", Policy: Policy{Allow: rules("*.allowed.test"), Deny: rules("no.allowed.test")}},
		host: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	public := []netip.Addr{netip.MustParseAddr("198.51.100.7")}
	many := make([]netip.Addr, maxPins+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})
	}
	for _, req := range []pinRequest{
		{Name: "other.test", Chain: []string{"other.test"}, Addrs: public},
		{Name: "a.allowed.test", Chain: []string{"other.test"}, Addrs: public},
		{Name: "a.allowed.test", Chain: []string{"a.allowed.test", "no.allowed.test"}, Addrs: public},
		{Name: "a.allowed.test", Chain: []string{"a.allowed.test"}, Addrs: []netip.Addr{netip.MustParseAddr("169.254.169.254")}},
		{Name: "a.allowed.test", Chain: []string{"a.allowed.test"}, Addrs: []netip.Addr{netip.MustParseAddr("10.1.2.3")}},
		{Name: "a.allowed.test", Chain: []string{"a.allowed.test"}, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		{Name: "a.allowed.test", Chain: []string{"a.allowed.test", "b\\.x"}, Addrs: public},
		{Name: "a.allowed.test", Chain: []string{"a.allowed.test"}, Addrs: many},
		{Name: "a.allowed.test", Chain: []string{"a.allowed.test"}},
	} {
		if err := g.pin(req); err == nil {
			t.Errorf("pinned %+v", req)
		}
	}
}
