package networld

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Link names: the worker's uplink, and world's end of it.
const (
	WorkerLink = "eth0"
	worldLink  = "to-worker"
)

// worldLoopback are the addresses world's loopback holds for its servers.
var worldLoopback = []string{AllowedAddr, OtherAddr, PyPIAddr, DNSAddr, PrivateAddr, MetadataAddr}

// wire joins worker and world by a veth and gives both their addresses
// and routes.
func (w *World) wire() error {
	wh, err := netlink.NewHandleAt(w.world)
	if err != nil {
		return fmt.Errorf("open netlink in world: %w", err)
	}
	defer wh.Close()
	kh, err := netlink.NewHandleAt(w.worker)
	if err != nil {
		return fmt.Errorf("open netlink in worker: %w", err)
	}
	defer kh.Close()

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: worldLink}, PeerName: WorkerLink, PeerNamespace: netlink.NsFd(w.worker)}
	if err := wh.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", worldLink, WorkerLink, err)
	}
	type side struct {
		h     *netlink.Handle
		link  string
		addrs []string // CIDRs on link
		lo    []string // CIDRs on lo
	}
	lo := make([]string, len(worldLoopback))
	for i, a := range worldLoopback {
		lo[i] = a + "/32"
	}
	for _, s := range []side{
		{wh, worldLink, []string{GatewayAddr + "/24", WorldAddr6 + "/64"}, lo},
		{kh, WorkerLink, []string{WorkerAddr + "/24", WorkerAddr6 + "/64"}, nil},
	} {
		if err := linkUp(s.h, "lo", s.lo); err != nil {
			return err
		}
		if err := linkUp(s.h, s.link, s.addrs); err != nil {
			return err
		}
	}
	uplink, err := kh.LinkByName(WorkerLink)
	if err != nil {
		return fmt.Errorf("find %s in worker: %w", WorkerLink, err)
	}
	if err := kh.RouteAdd(&netlink.Route{LinkIndex: uplink.Attrs().Index, Gw: net.ParseIP(GatewayAddr)}); err != nil {
		return fmt.Errorf("add the worker's default route: %w", err)
	}
	return nil
}

// linkUp gives link the addresses cidrs (IPv6 ones without duplicate
// address detection, so that they are usable at once) and sets it up.
func linkUp(h *netlink.Handle, name string, cidrs []string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find link %s: %w", name, err)
	}
	for _, c := range cidrs {
		a, err := netlink.ParseAddr(c)
		if err != nil {
			return fmt.Errorf("parse %s: %w", c, err)
		}
		if a.IP.To4() == nil {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add %s to %s: %w", c, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}
