package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/mountinfo"
)

// The router: every egress sandbox's link ends in one network namespace of
// flmbox's own, not in the host's, and its policy (its nftables table) lives
// there. The host's rules (a firewall reload, `nft flush ruleset`, a table
// deleted by hand) cannot reach it: a flush in the host's namespace flushes
// that namespace's nftables only. So a sandbox's packets are judged by its
// table whatever the host's rules become, and the host's own addresses are
// addresses the router forwards to, which the table refuses like any other
// (before, they were the host's local ones, delivered before any routing
// rule, and reachable while a flushed table's resolver was dead).
//
//	sandbox ns: eth0 --- router ns: flmbXXXX (gateway, resolver's sockets)
//	                                up --- host ns: flmbup --- the world
//
// The router forwards (ip_forward is its own), the host routes Range to it
// through one link pair and masquerades Range on the way out (guardTable):
// a flush of the host's rules breaks the sandboxes' connections (they leave
// unmasqueraded, answers do not come back), it opens nothing. The router is
// made by the first egress network (under hostLock) and removed with the
// last; it is bound at a path named by the host namespace's cookie under
// /run, which a reboot empties as it takes the namespace.

// Link names of the router's uplink: on the host's side (linkPrefix first:
// the forward guard accepts it) and in the router.
const (
	uplinkHost   = "flmbup"
	uplinkRouter = "up"
)

// netnsCookie is the cookie of this thread's network namespace, which the
// kernel never gives another namespace.
func netnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("find the network namespace: %w", err)
	}
	defer unix.Close(fd)
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("find the network namespace's cookie: %w", err)
	}
	return cookie, nil
}

// RouterPath is where the router of this process's network namespace is
// bound (there or not).
func RouterPath() (string, error) {
	cookie, err := netnsCookie()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(hostLock), fmt.Sprintf("egress-router-%d", cookie)), nil
}

// router is the router's namespace, open.
type router struct {
	ns netns.NsHandle
	h  *netlink.Handle
}

// openRouter opens the router; an error wrapping ErrGone if there is none.
func openRouter() (*router, error) {
	path, err := RouterPath()
	if err != nil {
		return nil, err
	}
	if !mountinfo.IsNsfs(path) {
		return nil, fmt.Errorf("the egress router %s: %w", path, ErrGone)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open the egress router: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	return &router{ns: ns, h: h}, nil
}

func (r *router) Close() {
	r.h.Close()
	r.ns.Close()
}

// nft opens nftables in the router.
func (r *router) nft() (*nftables.Conn, error) { return nftables.New(nftables.WithNetNSFd(int(r.ns))) }

// do runs f on a thread in the router's namespace (for what netlink
// handles do not reach: sysctls, sockets).
func (r *router) do(f func() error) error { return inNetNS(r.ns, f) }

// inNetNS runs f on a thread in the network namespace ns.
func inNetNS(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		errc <- f()
		// Back in its namespace, the thread is Go's again; if it cannot
		// go back, it stays locked and ends with this goroutine.
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
	}()
	return <-errc
}

// ensureRouter makes the router, or what of it is missing: its namespace,
// forwarding in it, its uplink pair with a /30 of Range, its default route,
// the host's route to Range through it, and its route guard. The caller
// holds hostLock.
func ensureRouter() (*router, error) {
	path, err := RouterPath()
	if err != nil {
		return nil, err
	}
	if !mountinfo.IsNsfs(path) {
		os.Remove(path) // a file without its namespace: a create killed early
		if l, err := netlink.LinkByName(uplinkHost); err == nil {
			netlink.LinkDel(l) // its other end was in a namespace now gone
		}
		if err := newNetNS(path); err != nil {
			return nil, fmt.Errorf("make the egress router: %w", err)
		}
	}
	r, err := openRouter()
	if err != nil {
		return nil, err
	}
	if err := r.ensure(); err != nil {
		r.Close()
		return nil, fmt.Errorf("make the egress router: %w", err)
	}
	return r, nil
}

func (r *router) ensure() error {
	if err := r.do(func() error {
		for _, f := range []string{ipForward, "/proc/sys/net/ipv6/conf/all/disable_ipv6"} {
			if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	lo, err := r.h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := r.h.LinkSetUp(lo); err != nil {
		return err
	}
	up, err := r.h.LinkByName(uplinkRouter)
	if err != nil {
		if l, err := netlink.LinkByName(uplinkHost); err == nil {
			netlink.LinkDel(l)
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: uplinkHost}, PeerName: uplinkRouter, PeerNamespace: netlink.NsFd(r.ns)}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add link %s: %w", uplinkHost, err)
		}
		if up, err = r.h.LinkByName(uplinkRouter); err != nil {
			return err
		}
	}
	host, err := netlink.LinkByName(uplinkHost)
	if err != nil {
		return fmt.Errorf("link %s: %w", uplinkHost, err)
	}
	hostGW, routerAddr, err := r.uplinkAddrs(host, up)
	if err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+uplinkHost+"/disable_ipv6", []byte("1\n"), 0o644); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	if err := r.h.LinkSetUp(up); err != nil {
		return err
	}
	if err := r.h.RouteReplace(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: hostGW.AsSlice()}); err != nil {
		return fmt.Errorf("route the egress router: %w", err)
	}
	dst := &net.IPNet{IP: Range.Addr().AsSlice(), Mask: net.CIDRMask(Range.Bits(), 32)}
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: dst, Gw: routerAddr.AsSlice()}); err != nil {
		return fmt.Errorf("route %s to the egress router: %w", Range, err)
	}
	return addRouteGuard(r.h)
}

// uplinkAddrs are the uplink's addresses, given now if it has none: the
// last /30 of Range (sandboxes take theirs from the first), .1 the host's
// end, .2 the router's.
func (r *router) uplinkAddrs(host, up netlink.Link) (hostGW, routerAddr netip.Addr, err error) {
	have, err := r.h.AddrList(up, netlink.FAMILY_V4)
	if err != nil {
		return hostGW, routerAddr, err
	}
	if len(have) > 0 {
		routerAddr, _ = netip.AddrFromSlice(have[0].IP.To4())
		return routerAddr.Prev(), routerAddr, nil
	}
	hostGW, routerAddr = uplinkSubnet().Addr().Next(), uplinkSubnet().Addr().Next().Next()
	if err := netlink.AddrReplace(host, &netlink.Addr{IPNet: ipNet(hostGW)}); err != nil {
		return hostGW, routerAddr, fmt.Errorf("address link %s: %w", uplinkHost, err)
	}
	if err := r.h.AddrReplace(up, &netlink.Addr{IPNet: ipNet(routerAddr)}); err != nil {
		return hostGW, routerAddr, fmt.Errorf("address the egress router's uplink: %w", err)
	}
	return hostGW, routerAddr, nil
}

// uplinkSubnet is the uplink's /30: Range's last.
func uplinkSubnet() netip.Prefix {
	b := Range.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += 1<<(32-Range.Bits()) - 4
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 30)
}

// freeSubnet returns want's /30 if it is free, else the first /30 of Range
// that no link of the host's or the router's has an address in: its .1 and
// .2 addresses.
func (r *router) freeSubnet(want netip.Addr) (gw, sb netip.Addr, err error) {
	var all []netlink.Addr
	for _, h := range []*netlink.Handle{nil, r.h} {
		var addrs []netlink.Addr
		if h == nil {
			addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4)
		} else {
			addrs, err = h.AddrList(nil, netlink.FAMILY_V4)
		}
		if err != nil {
			return gw, sb, fmt.Errorf("list addresses: %w", err)
		}
		all = append(all, addrs...)
	}
	used := map[netip.Addr]bool{uplinkSubnet().Addr(): true}
	for _, a := range all {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && Range.Contains(ip) {
			used[netip.PrefixFrom(ip, 30).Masked().Addr()] = true
		}
	}
	return firstFree(used, want)
}

// sandboxLinks are the names of the sandboxes' links in the router.
func (r *router) sandboxLinks() ([]string, error) {
	links, err := r.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the egress router's links: %w", err)
	}
	var out []string
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, linkPrefix) {
			out = append(out, n)
		}
	}
	return out, nil
}

// removeRouterIfUnused removes the router (its namespace, and with it
// every link and table in it, and the uplink) if no sandbox's link is left
// in it, and then restores the host's forwarding. The caller holds
// hostLock.
func removeRouterIfUnused() error {
	r, err := openRouter()
	if errors.Is(err, ErrGone) {
		if l, err := netlink.LinkByName(uplinkHost); err == nil {
			netlink.LinkDel(l)
		}
		return restoreForwarding()
	}
	if err != nil {
		return err
	}
	links, err := r.sandboxLinks()
	r.Close()
	if err != nil || len(links) > 0 {
		return err
	}
	path, err := RouterPath()
	if err != nil {
		return err
	}
	// The uplink pair goes with the namespace's end; deleting the host's
	// end first removes the route to Range at once.
	if l, err := netlink.LinkByName(uplinkHost); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("delete link %s: %w", uplinkHost, err)
		}
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount the egress router %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return restoreForwarding()
}
