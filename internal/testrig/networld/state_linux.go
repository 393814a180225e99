package networld

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// State is what a program running in the worker can leave behind in the
// network: a test compares two to find what was not cleaned up.
type State struct {
	// Links are the worker's links: "NAME TYPE".
	Links []string
	// Addrs are the worker's addresses: "LINK CIDR".
	Addrs []string
	// Routes are the worker's routes, of every table and family.
	Routes []string
	// Tables are the worker's nftables tables: "FAMILY NAME".
	Tables []string
	// Procs are the processes in the worker's namespace: "PID COMM".
	Procs []string
	// Forwarding is the worker's net.ipv4.ip_forward: "0" or "1".
	Forwarding string
}

// String lists s, one item a line.
func (s State) String() string {
	var b strings.Builder
	for _, part := range []struct {
		name  string
		items []string
	}{{"links", s.Links}, {"addrs", s.Addrs}, {"routes", s.Routes}, {"nftables", s.Tables}, {"procs", s.Procs}, {"ip_forward", []string{s.Forwarding}}} {
		for _, it := range part.items {
			fmt.Fprintf(&b, "%s: %s\n", part.name, it)
		}
	}
	return b.String()
}

// WorkerState reads the worker's links, addresses, routes (but the local
// table's, the kernel's own for the worker's addresses), nftables tables,
// processes and forwarding.
func (w *World) WorkerState() (State, error) {
	var s State
	h, err := netlink.NewHandleAt(w.worker)
	if err != nil {
		return s, fmt.Errorf("open netlink in worker: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return s, fmt.Errorf("list the worker's links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
		s.Links = append(s.Links, l.Attrs().Name+" "+l.Type())
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return s, fmt.Errorf("list the addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			s.Addrs = append(s.Addrs, l.Attrs().Name+" "+a.IPNet.String())
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return s, fmt.Errorf("list the worker's routes: %w", err)
	}
	for _, r := range routes {
		if r.Table == unix.RT_TABLE_LOCAL || r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() {
			continue // the kernel's, for the worker's own addresses (compared as Addrs), added once they are no longer tentative
		}
		s.Routes = append(s.Routes, fmt.Sprintf("table %d dev %s %s", r.Table, names[r.LinkIndex], r))
	}
	nft, err := nftables.New(nftables.WithNetNSFd(int(w.worker)))
	if err != nil {
		return s, fmt.Errorf("open nftables in worker: %w", err)
	}
	tables, err := nft.ListTables()
	if err != nil {
		return s, fmt.Errorf("list the worker's nftables tables: %w", err)
	}
	for _, t := range tables {
		s.Tables = append(s.Tables, fmt.Sprintf("%s %s", familyName(t.Family), t.Name))
	}
	if s.Procs, err = w.workerProcs(); err != nil {
		return s, err
	}
	// /proc/sys/net is the namespace's of the process that reads it.
	fwd, err := w.Command(context.Background(), "cat", "/proc/sys/net/ipv4/ip_forward").Output()
	if err != nil {
		return s, fmt.Errorf("read the worker's ip_forward: %w", err)
	}
	s.Forwarding = strings.TrimSpace(string(fwd))
	for _, l := range [][]string{s.Links, s.Addrs, s.Routes, s.Tables} {
		sort.Strings(l)
	}
	return s, nil
}

// workerProcs lists the processes whose network namespace is the
// worker's: "PID COMM". (A thread of this process that entered the worker
// is not one: it is not its process's leader.)
func (w *World) workerProcs() ([]string, error) {
	var want unix.Stat_t
	if err := unix.Fstat(int(w.worker), &want); err != nil {
		return nil, fmt.Errorf("stat the worker's namespace: %w", err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var procs []string
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil || st.Dev != want.Dev || st.Ino != want.Ino {
			continue // gone, or elsewhere
		}
		comm, _ := os.ReadFile("/proc/" + e.Name() + "/comm")
		procs = append(procs, e.Name()+" "+strings.TrimSpace(string(comm)))
	}
	return procs, nil
}

// WorkerTables lists the worker's nftables tables: "FAMILY NAME".
func (w *World) WorkerTables() ([]string, error) {
	s, err := w.WorkerState()
	return s.Tables, err
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	case nftables.TableFamilyBridge:
		return "bridge"
	}
	return fmt.Sprintf("family-%d", f)
}
