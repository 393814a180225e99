package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/flock"
	"github.com/flmbox/flmbox/internal/mountinfo"
)

// Network is one sandbox's egress network: a network namespace of its own
// (which runsc --network=sandbox joins), a veth pair from it to the host,
// a /30 of Range, and the sandbox's nftables table on the host side.
type Network struct {
	// ID is the sandbox's runsc container ID: it names the table and the
	// host's link.
	ID string `json:"id"`
	// NetNS is where the namespace is bind-mounted.
	NetNS string `json:"netns"`
	// Host is the host side's link.
	Host string `json:"host"`
	// Gateway is the host side's address: the sandbox's router and its
	// DNS server.
	Gateway netip.Addr `json:"gateway"`
	// Addr is the sandbox's address.
	Addr netip.Addr `json:"addr"`
	// Counts is the file that keeps the refusal counts of the sandbox's
	// earlier tables (see countBook); none if empty.
	Counts string `json:"-"`
}

// Range is where sandboxes' addresses come from by default, a /30 each.
var Range = netip.MustParsePrefix("10.200.0.0/16")

// sandboxLink is the link's name inside the sandbox's namespace.
const sandboxLink = "eth0"

// linkPrefix starts the host side's link of every egress sandbox.
const linkPrefix = "flmb"

// HostLink is the host side's link name of the sandbox whose runsc ID is
// id: linkPrefix and 11 hex digits of the ID.
func HostLink(id string) string {
	h := id[strings.LastIndexByte(id, '-')+1:]
	return linkPrefix + h[:min(len(h), unix.IFNAMSIZ-1-len(linkPrefix))]
}

// hostLock serializes the changes of egress networks to the host between
// processes, whatever their state roots: two sandboxes never share
// addresses, and forwarding is turned off only when no egress link is left.
const hostLock = "/run/flmbox/egress.lock"

// lockHost takes hostLock.
func lockHost(ctx context.Context) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(hostLock), 0o700); err != nil {
		return nil, err
	}
	l, err := flock.LockFile(ctx, hostLock, 0o600, flock.Exclusive)
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

// Create makes the network of the sandbox whose runsc ID is id: its
// namespace bound at nsPath, the veth pair, addresses, routes and the
// table that enforces p (an error if any of it cannot be made, and then
// nothing is left). Forwarding is turned on if it is off (see
// enableForwarding).
func Create(ctx context.Context, id, nsPath string, p Policy) (_ *Network, err error) {
	return create(ctx, id, nsPath, p, netip.Addr{})
}

// create is Create, with the gateway want if its /30 is free.
func create(ctx context.Context, id, nsPath string, p Policy, want netip.Addr) (_ *Network, err error) {
	n := &Network{ID: id, NetNS: nsPath, Host: HostLink(id)}
	defer func() {
		if err != nil {
			Delete(id, nsPath) // after unlock, deferred below
			err = fmt.Errorf("make the sandbox's egress network: %w", err)
		}
	}()
	unlock, err := lockHost(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := enableForwarding(); err != nil {
		return nil, err
	}
	r, err := ensureRouter()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := newNetNS(nsPath); err != nil {
		return nil, err
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	if n.Gateway, n.Addr, err = r.freeSubnet(want); err != nil {
		return nil, err
	}
	// The address's earlier owner may have left connections: none may
	// pass as this sandbox's established ones. They are forgotten while
	// the link is made, and before Create returns (nothing passes before
	// runsc runs).
	forgotten := make(chan error, 1)
	go func() { forgotten <- r.forgetConnections(n.Addr) }()
	defer func() { // before the deferred unlock; the first defer then deletes
		if ferr := <-forgotten; ferr != nil && err == nil {
			err = ferr
		}
	}()
	// The link's router end takes the router's default, IPv6 off.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.Host}, PeerName: sandboxLink, PeerNamespace: netlink.NsFd(ns)}
	if err := r.h.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("add link %s: %w", n.Host, err)
	}
	host, err := r.h.LinkByName(n.Host)
	if err != nil {
		return nil, err
	}
	if err := r.h.AddrAdd(host, &netlink.Addr{IPNet: ipNet(n.Gateway)}); err != nil {
		return nil, fmt.Errorf("address link %s: %w", n.Host, err)
	}
	if err := r.h.LinkSetUp(host); err != nil {
		return nil, err
	}
	if err := n.Configure(); err != nil {
		return nil, err
	}
	c, err := r.nft()
	if err != nil {
		return nil, err
	}
	if err := n.rules(c, p); err != nil {
		return nil, err
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("install the policy's nftables table %s: %w", TableName(id), err)
	}
	return n, nil
}

// forgetConnections deletes the connections the router and the host track
// from addr, a sandbox's address.
func (r *router) forgetConnections(addr netip.Addr) error {
	f := &netlink.ConntrackFilter{}
	if err := f.AddIP(netlink.ConntrackOrigSrcIP, addr.AsSlice()); err != nil {
		return err
	}
	for _, h := range []*netlink.Handle{r.h, nil} {
		var err error
		if h == nil {
			_, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
		} else {
			_, err = h.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
		}
		if err != nil {
			return fmt.Errorf("forget the connections of %s: %w", addr, err)
		}
	}
	return nil
}

// ipNet is a's /30.
func ipNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}
}

// Configure addresses the sandbox's side of the link and routes through the
// gateway. runsc takes the link's addresses and routes for its own network
// stack and removes them from the namespace: a restore needs them again.
func (n *Network) Configure() error {
	ns, err := netns.GetFromPath(n.NetNS)
	if err != nil {
		return fmt.Errorf("open network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(sandboxLink)
	if err != nil {
		return err
	}
	if err := h.AddrReplace(l, &netlink.Addr{IPNet: ipNet(n.Addr)}); err != nil {
		return fmt.Errorf("address the sandbox's link: %w", err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return err
	}
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return err
	}
	def := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: n.Gateway.AsSlice()}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("route the sandbox's link: %w", err)
	}
	return nil
}

// firstFree returns want's /30 if it is not used, else the first /30 of
// Range that is not: its .1 (gateway) and .2 (sandbox) addresses.
func firstFree(used map[netip.Addr]bool, want netip.Addr) (gw, sb netip.Addr, err error) {
	if w := netip.PrefixFrom(want, 30).Masked().Addr(); want.IsValid() && Range.Contains(want) && !used[w] {
		return w.Next(), w.Next().Next(), nil
	}
	base := Range.Masked().Addr().As4()
	for i := uint32(0); i < 1<<(32-Range.Bits()-2); i++ {
		b := base
		v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) + i*4
		net := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		if !used[net] {
			return net.Next(), net.Next().Next(), nil
		}
	}
	return gw, sb, fmt.Errorf("no free /30 in %s: %w", Range, errdefs.ErrResourceExhausted)
}

// newNetNS makes a network namespace and binds it at path.
func newNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return fmt.Errorf("make network namespace: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		errc <- inNewNetNS(path)
		// Back to the host's namespace, the thread is Go's again; if it
		// cannot go back, it stays locked and ends with this goroutine.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return fmt.Errorf("make network namespace: %w", err)
	}
	return nil
}

// inNewNetNS readies the namespace of the calling thread, new: IPv6 off by
// default (a sandbox has none: its link, made in the namespace later,
// takes the default; /proc/sys/net is the namespace's of the thread that
// opens it), and binds it at path.
func inNewNetNS(path string) error {
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1\n"), 0o644); err != nil && !os.IsNotExist(err) {
		return err
	}
	return unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
}

// Delete removes what Create made for the sandbox whose runsc ID is id
// (its table, link, and namespace at nsPath), whatever of it is there. The
// last egress sandbox's Delete turns forwarding off again if Create turned
// it on (see enableForwarding).
func Delete(id, nsPath string) error {
	unlock, err := lockHost(context.Background())
	if err != nil {
		return fmt.Errorf("delete the sandbox's egress network: %w", err)
	}
	defer unlock()
	var errs []error
	if r, err := openRouter(); err == nil {
		if c, err := r.nft(); err == nil {
			c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(id)})
			if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete nftables table %s: %w", TableName(id), err))
			}
		}
		// The connections tracked from the sandbox's address are
		// forgotten when the address is given out again (Create), not
		// here.
		if l, err := r.h.LinkByName(HostLink(id)); err == nil {
			if err := r.h.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
			}
		}
		r.Close()
	}
	if nsPath != "" {
		if err := unix.Unmount(nsPath, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("unmount network namespace %s: %w", nsPath, err))
		}
		if err := os.Remove(nsPath); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, removeRouterIfUnused())
	}
	return errors.Join(errs...)
}

// Prune deletes the tables of egress sandboxes whose link is gone (the
// sandbox's namespace went without its removal, say with its state root):
// Create makes a sandbox's link before its table, both under hostLock, so
// a table without a link is nobody's, whatever state root made it. Their
// resolvers leave by themselves once their table is gone. The router goes
// with its last link, and forwarding is restored then. A host that made no
// egress network since it booted costs a stat: not even hostLock is taken.
func Prune(ctx context.Context) error {
	if _, err := os.Stat(hostLock); err != nil {
		return nil
	}
	unlock, err := lockHost(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	r, err := openRouter()
	if errors.Is(err, ErrGone) {
		return removeRouterIfUnused()
	}
	if err != nil {
		return err
	}
	defer r.Close()
	c, err := r.nft()
	if err != nil {
		return err
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	deleted := false
	for _, t := range ts {
		if !isTableName(t.Name) {
			continue
		}
		if _, err := r.h.LinkByName(HostLink(t.Name)); err == nil {
			continue
		}
		c.DelTable(t)
		deleted = true
	}
	if deleted {
		if err := c.Flush(); err != nil {
			return fmt.Errorf("delete the tables of egress sandboxes that are gone: %w", err)
		}
	}
	// The router and forwarding too, once no egress link is left.
	return removeRouterIfUnused()
}

// isTableName reports whether name is an egress sandbox's table's: a
// runsc container ID of flmbox's ("flmbox-" and 24 hex digits).
func isTableName(name string) bool {
	h, ok := strings.CutPrefix(name, "flmbox-")
	if !ok || len(h) != 24 {
		return false
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ErrGone is in the error of Ensure when the sandbox's namespace or link is
// gone (as after a reboot): Recreate makes them again.
var ErrGone = errors.New("the sandbox's network namespace or link is gone")

// Ensure checks that n is whole, and makes again what can be made without
// its namespace: its table (the policy, p; its pins are lost) if it went
// (a flush of the host's rules), its link up if it is down (the resolver
// takes it down when the table goes). It returns what it repaired, and an
// error wrapping ErrGone if the namespace or link is gone.
func (n *Network) Ensure(ctx context.Context, p Policy) (repaired []string, err error) {
	unlock, err := lockHost(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !mountinfo.IsNsfs(n.NetNS) {
		return nil, fmt.Errorf("network namespace %s: %w", n.NetNS, ErrGone)
	}
	r, err := openRouter()
	if err != nil {
		return nil, err
	}
	r.Close()
	// The host's side first, if a flush of the host's rules took it:
	// forwarding's guard, the router's masquerade, its routes.
	if c, err := nftables.New(); err == nil {
		if t, err := inetTable(c, natTable); err == nil && t == nil {
			repaired = append(repaired, "the host's masquerade of egress sandboxes (nftables table "+natTable+", gone: were the host's rules flushed?)")
		}
	}
	if err := enableForwarding(); err != nil {
		return nil, err
	}
	if r, err = ensureRouter(); err != nil {
		return nil, err
	}
	defer r.Close()
	l, err := r.h.LinkByName(n.Host)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", n.Host, ErrGone)
	}
	c, err := r.nft()
	if err != nil {
		return nil, err
	}
	t, err := inetTable(c, TableName(n.ID))
	if err != nil {
		return nil, err
	}
	why := ""
	if t == nil {
		why = "gone: was the egress router's ruleset flushed?"
	} else if err := n.checkTable(c, p); errors.Is(err, errTableChanged) {
		// A table flushed or cut is made again whole: its pins go.
		why = "changed: was the egress router's ruleset flushed?"
	} else if err != nil {
		return nil, err
	}
	if why != "" {
		if err := n.carryCounts(); err != nil {
			return nil, err
		}
		if t != nil {
			c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(n.ID)})
		}
		if err := n.rules(c, p); err != nil {
			return nil, err
		}
		if err := c.Flush(); err != nil {
			return nil, fmt.Errorf("install the policy's nftables table %s again: %w", TableName(n.ID), err)
		}
		repaired = append(repaired, "its nftables table "+TableName(n.ID)+" ("+why+")")
	} else if err := n.refreshHostAddrs(c); err != nil {
		return nil, err
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := r.h.LinkSetUp(l); err != nil {
			return repaired, err
		}
		repaired = append(repaired, "its link "+n.Host+" (down)")
	}
	return repaired, nil
}

// Recreate makes n's network again from nothing (its namespace, link and
// table: what a reboot took), with its addresses if they are free; n is
// updated with what it got.
func (n *Network) Recreate(ctx context.Context, p Policy) error {
	if err := n.carryCounts(); err != nil {
		return err
	}
	if err := Delete(n.ID, n.NetNS); err != nil {
		return err
	}
	m, err := create(ctx, n.ID, n.NetNS, p, n.Gateway)
	if err != nil {
		return err
	}
	m.Counts = n.Counts
	*n = *m
	return nil
}
