package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// These tests stand in for a sandbox with the kernel's own stack in its
// namespace (Configure gives it the addresses runsc would take), behind
// the real link, table and forwarding, with an "outside" namespace at
// 198.51.100.2 that echoes UDP on :9000.

// inNS runs fn on a thread in the namespace at path.
func inNS(t *testing.T, path string, fn func()) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := inNetNS(ns, func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// outside makes a namespace at 198.51.100.2, linked to this one
// (198.51.100.1), with a UDP echo server on :9000.
func outside(t *testing.T) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "out")
	if err := newNetNS(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
	ns, err := netns.GetFromPath(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "out"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName("out")
	if err == nil {
		err = netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.51.100.1"), Mask: net.CIDRMask(24, 32)}})
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		t.Fatal(err)
	}
	inNS(t, p, func() {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			err = netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.51.100.2"), Mask: net.CIDRMask(24, 32)}})
		}
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			t.Error(err)
			return
		}
		pc, err := net.ListenPacket("udp4", "198.51.100.2:9000")
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			b := make([]byte, 1500)
			for {
				n, a, err := pc.ReadFrom(b)
				if err != nil {
					return
				}
				pc.WriteTo(b[:n], a)
			}
		}()
	})
}

// echoed reports whether a datagram from n's sandbox address, port sport,
// to the outside's echo comes back.
func echoed(t *testing.T, n *Network, sport int) bool {
	t.Helper()
	ok := false
	inNS(t, n.NetNS, func() {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: n.Addr.AsSlice(), Port: sport}, &net.UDPAddr{IP: net.ParseIP("198.51.100.2"), Port: 9000})
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		c.Write([]byte("hi"))
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, err = c.Read(make([]byte, 8))
		ok = err == nil
	})
	return ok
}

// echoedWithin polls echoed, a new source port each time, until it holds
// or d passed.
func echoedWithin(t *testing.T, n *Network, sport int, d time.Duration) bool {
	t.Helper()
	for deadline := time.Now().Add(d); ; sport++ {
		if echoed(t, n, sport) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestConntrackForgotten: a sandbox that takes a removed one's address
// does not inherit its connections.
func TestConntrackForgotten(t *testing.T) {
	if !inPrivateNetNS(t) {
		return
	}
	outside(t)
	ctx := context.Background()
	// Another sandbox keeps the router (and its connection tracking).
	k, err := Create(ctx, "flmbox-abababababababababababab", filepath.Join(t.TempDir(), "netns"), Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(k.ID, k.NetNS) })
	a, err := Create(ctx, "flmbox-aaaaaaaaaaaaaaaaaaaaaaaa", filepath.Join(t.TempDir(), "netns"), Policy{Allow: rules("198.51.100.2")})
	if err != nil {
		t.Fatal(err)
	}
	if !echoed(t, a, 40000) {
		t.Fatal("an allowed address does not echo")
	}
	if err := Delete(a.ID, a.NetNS); err != nil {
		t.Fatal(err)
	}
	b, err := Create(ctx, "flmbox-bbbbbbbbbbbbbbbbbbbbbbbb", filepath.Join(t.TempDir(), "netns"), Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(b.ID, b.NetNS) })
	if b.Addr != a.Addr {
		t.Fatalf("B got %v, not A's %v: the test proves nothing", b.Addr, a.Addr)
	}
	if echoed(t, b, 40001) || echoed(t, b, 40000) {
		t.Fatal("a sandbox that allows nothing reached the outside (through its address's earlier owner's flow?)")
	}
}

// TestEnsure: a table that went (a flush of the router's rules) is made
// again, the policy holds again, and a link taken down comes up; a
// namespace gone (a reboot) is ErrGone, and Recreate makes the network
// again with its addresses.
func TestEnsure(t *testing.T) {
	if !inPrivateNetNS(t) {
		return
	}
	outside(t)
	ctx := context.Background()
	p := Policy{Allow: rules("198.51.100.2:9000")}
	n, err := Create(ctx, "flmbox-cccccccccccccccccccccccc", filepath.Join(t.TempDir(), "netns"), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(n.ID, n.NetNS) })
	if got, err := n.Ensure(ctx, p); err != nil || len(got) != 0 {
		t.Fatalf("Ensure of a whole network: %v, %v", got, err)
	}
	c := routerNft(t)
	routerPath, err := RouterPath()
	if err != nil {
		t.Fatal(err)
	}
	// A table flushed (its rules gone, the table left) is no whole table:
	// the resolver's watch hears of it at once, its check sees it, and
	// Ensure makes the table whole again.
	g := &guard{cfg: ResolverConfig{Table: TableName(n.ID), Link: n.Host, Gateway: n.Gateway, Policy: p}, nft: c}
	if err := g.checkTable(); err != nil {
		t.Fatalf("checkTable of a whole table: %v", err)
	}
	var changed <-chan error
	var stop func()
	inNS(t, routerPath, func() { changed, stop = g.watchTable(ctx) }) // the guard lives in the router
	c.FlushTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(n.ID)})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-changed:
		if !errors.Is(err, errTableChanged) {
			t.Fatalf("the watch said %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not hear of the table's flush")
	}
	stop()
	if err := g.checkTable(); !errors.Is(err, errTableChanged) {
		t.Fatalf("checkTable of a flushed table: %v", err)
	}
	if got, err := n.Ensure(ctx, p); err != nil || len(got) != 1 || !strings.Contains(got[0], "changed") {
		t.Fatalf("Ensure of a flushed table: %v, %v", got, err)
	}
	if err := g.checkTable(); err != nil {
		t.Fatalf("checkTable after Ensure: %v", err)
	}
	c.FlushRuleset()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// With no table (and the link up: no resolver took it down), the
	// router's routing forwards nothing of the sandbox's (addRouteGuard).
	if echoed(t, n, 40001) {
		t.Fatal("the outside echoes with the sandbox's table gone")
	}
	// What the resolver, in the router, does when it finds the table gone.
	inNS(t, routerPath, func() {
		if err := g.failClosed(errors.New("the table is gone")); err == nil || !strings.Contains(err.Error(), "taken down") {
			t.Errorf("failClosed: %v", err)
		}
	})
	if echoed(t, n, 40002) {
		t.Fatal("the outside echoes through a link taken down")
	}
	got, err := n.Ensure(ctx, p)
	if err != nil || len(got) != 2 {
		t.Fatalf("Ensure after a flush: %v, %v", got, err)
	}
	// The link's carrier comes back a moment after it is up.
	if !echoedWithin(t, n, 40010, 10*time.Second) {
		t.Fatal("the allowed port does not echo after Ensure")
	}
	// A reboot: the namespace's mount, the link and the table are gone.
	gw := n.Gateway
	if err := unix.Unmount(n.NetNS, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	c.FlushRuleset()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if !slices.Contains(routerLinks(t), n.Host) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the link outlives its namespace")
		}
	}
	if _, err := n.Ensure(ctx, p); !errors.Is(err, ErrGone) {
		t.Fatalf("Ensure after a reboot: %v, want ErrGone", err)
	}
	if err := n.Recreate(ctx, p); err != nil {
		t.Fatal(err)
	}
	if n.Gateway != gw {
		t.Errorf("made again with gateway %v, want its own %v", n.Gateway, gw)
	}
	if !echoedWithin(t, n, 40100, 10*time.Second) {
		t.Fatal("the allowed port does not echo after Recreate")
	}
}

// udpEcho serves UDP echo on pc until it is closed.
func udpEcho(pc net.PacketConn) {
	b := make([]byte, 1500)
	for {
		n, a, err := pc.ReadFrom(b)
		if err != nil {
			return
		}
		pc.WriteTo(b[:n], a)
	}
}

// TestDNSOnlyToResolver: DNS from a sandbox reaches only its resolver's
// marked socket, never another service of the host's on port 53 (as while
// the resolver is not running).
func TestDNSOnlyToResolver(t *testing.T) {
	if !inPrivateNetNS(t) {
		return
	}
	n, err := Create(context.Background(), "flmbox-eeeeeeeeeeeeeeeeeeeeeeee", filepath.Join(t.TempDir(), "netns"), Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(n.ID, n.NetNS) })
	asks := func() bool {
		ok := false
		inNS(t, n.NetNS, func() {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: n.Gateway.AsSlice(), Port: 53})
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.Write([]byte("q"))
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err = c.Read(make([]byte, 8))
			ok = err == nil
		})
		return ok
	}
	routerPath, err := RouterPath()
	if err != nil {
		t.Fatal(err)
	}
	listen := func(lc net.ListenConfig, addr string) (pc net.PacketConn) {
		inNS(t, routerPath, func() {
			var err error
			if pc, err = lc.ListenPacket(context.Background(), "udp4", addr); err != nil {
				t.Error(err)
			}
		})
		if pc == nil {
			t.FailNow()
		}
		return pc
	}
	other := listen(net.ListenConfig{}, "0.0.0.0:53") // another DNS service where the resolver listens
	go udpEcho(other)
	if asks() {
		t.Fatal("the sandbox reached a service on port 53 that is not its resolver")
	}
	other.Close() // without SO_REUSEADDR on both, the two cannot bind at once
	mine := listen(net.ListenConfig{Control: markSocket}, netip.AddrPortFrom(n.Gateway, 53).String())
	defer mine.Close()
	go udpEcho(mine)
	if !asks() {
		t.Fatal("the sandbox does not reach its resolver's marked socket")
	}
}
