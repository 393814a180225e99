package egress

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const ipForward = "/proc/sys/net/ipv4/ip_forward"

// guardTable is the table enableForwarding adds when it turns forwarding
// on: the host forwarded nothing before, and forwards only its egress
// sandboxes' packets after.
const guardTable = "flmbox-forward-guard"

// forwardingMark is the file that says that flmbox turned IPv4 forwarding
// on in this process's network namespace, and so turns it off again once
// its last egress link goes. It is named by the namespace's cookie, which
// the kernel never gives another namespace, and kept under /run, which a
// reboot empties as it resets the setting. A file, not the guard table as
// before: a flush of the host's ruleset removed the table, and forwarding
// then stayed on for good after the last egress sandbox.
func forwardingMark() (string, error) {
	cookie, err := netnsCookie()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(hostLock), fmt.Sprintf("forwarding-%d", cookie)), nil
}

// enableForwarding turns IPv4 forwarding on in the host's network
// namespace if it is off, which egress sandboxes need (as Docker's bridge
// does). A host that did not forward keeps not forwarding anything else:
// flmbox adds the table guardTable, whose forward chain drops what neither
// comes from nor goes to an egress sandbox's link, before it turns
// forwarding on, and again whenever it finds the table gone (a flush of the
// host's ruleset) while forwarding is its doing (forwardingMark, written
// first). The caller holds hostLock.
func enableForwarding() error {
	if err := addHostNAT(); err != nil {
		return err
	}
	mark, err := forwardingMark()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(ipForward)
	if err != nil {
		return fmt.Errorf("read %s: %w", ipForward, err)
	}
	on := string(bytes.TrimSpace(b)) == "1"
	ours, err := fileExists(mark)
	if err != nil {
		return err
	}
	if on && !ours {
		// Forwarding was on before flmbox: an old flmbox's guard table
		// says it was flmbox's doing.
		if ours, err = hasGuard(); err != nil || !ours {
			return err
		}
		if err := os.WriteFile(mark, nil, 0o644); err != nil {
			return fmt.Errorf("note that flmbox turned IPv4 forwarding on: %w", err)
		}
	}
	if !on {
		if err := os.WriteFile(mark, nil, 0o644); err != nil {
			return fmt.Errorf("note that flmbox turns IPv4 forwarding on: %w", err)
		}
	}
	if err := addGuard(); err != nil {
		return err
	}
	if !on {
		if err := os.WriteFile(ipForward, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("turn IPv4 forwarding on: %w", err)
		}
	}
	return nil
}

// addGuard adds guardTable, or makes its chain again.
func addGuard() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: guardTable})
	policy := nftables.ChainPolicyDrop
	ch := c.AddChain(&nftables.Chain{Table: t, Name: "forward", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	c.FlushChain(ch)
	prefix := []byte(linkPrefix) // compares the name's first bytes only
	for _, key := range []expr.MetaKey{expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: prefix},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables table %s: %w", guardTable, err)
	}
	return nil
}

// hasGuard reports whether guardTable is there.
func hasGuard() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	t, err := inetTable(c, guardTable)
	return t != nil, err
}

func fileExists(path string) (bool, error) {
	_, err := os.Stat(path)
	if os.IsNotExist(err) {
		return false, nil
	}
	return err == nil, err
}

// restoreForwarding turns forwarding off and removes guardTable if flmbox
// turned it on (forwardingMark, or the guard table of an older flmbox) and
// no egress sandbox's link is left: the host forwards as it did before,
// whatever was flushed meanwhile. The caller holds hostLock.
func restoreForwarding() error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, linkPrefix) {
			return nil
		}
	}
	// The host's masquerade of Range, and the route guard an older flmbox
	// kept in the host (now in the router).
	if err := delHostNAT(); err != nil {
		return err
	}
	if err := delRouteGuard(nil); err != nil {
		return err
	}
	mark, err := forwardingMark()
	if err != nil {
		return err
	}
	ours, err := fileExists(mark)
	if err != nil {
		return err
	}
	guard, err := hasGuard()
	if err != nil {
		return err
	}
	if !ours && !guard {
		return nil // forwarding was on before flmbox
	}
	if err := os.WriteFile(ipForward, []byte("0\n"), 0o644); err != nil {
		return fmt.Errorf("turn IPv4 forwarding off again: %w", err)
	}
	if guard {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: guardTable})
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete nftables table %s: %w", guardTable, err)
		}
	}
	if err := os.Remove(mark); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// The route guard: three rules of the router's routing policy, which no
// flush of nftables touches. A packet from Range (a sandbox's address: the
// link's source check drops others) is routed by the main table only if it
// carries routeMark, which the sandbox's table sets on every packet of its
// link; else it is prohibited. So a sandbox's table flushed or deleted in
// the router forwards nothing at once, whether or not its resolver lives to
// take the link down. The router's own packets from a gateway's address (a
// refusal's TCP reset or ICMP error, the resolver's answers) are routed as
// before (rulePrefLocal: iif lo is a packet the router sends). The host
// keeps none (an older flmbox's are deleted): the router's packets reach it
// unmarked (a mark does not cross namespaces).
const (
	routeMark        = ResolverMark // "flmb"
	rulePrefLocal    = 10865
	rulePrefMarked   = 10866
	rulePrefProhibit = 10867
)

// routeGuard are the route guard's rules.
func routeGuard() []*netlink.Rule {
	mask := uint32(0xffffffff)
	src := &net.IPNet{IP: Range.Addr().AsSlice(), Mask: net.CIDRMask(Range.Bits(), 32)}
	local := netlink.NewRule()
	local.Priority, local.Family, local.Src, local.IifName, local.Table = rulePrefLocal, netlink.FAMILY_V4, src, "lo", unix.RT_TABLE_MAIN
	marked := netlink.NewRule()
	marked.Priority, marked.Family, marked.Src, marked.Mark, marked.Mask, marked.Table = rulePrefMarked, netlink.FAMILY_V4, src, routeMark, &mask, unix.RT_TABLE_MAIN
	prohibit := netlink.NewRule()
	prohibit.Priority, prohibit.Family, prohibit.Src, prohibit.Type = rulePrefProhibit, netlink.FAMILY_V4, src, unix.FR_ACT_PROHIBIT
	return []*netlink.Rule{local, marked, prohibit}
}

// addRouteGuard adds the route guard's rules that are missing, with h (the
// router's). The caller holds hostLock.
func addRouteGuard(h *netlink.Handle) error {
	have, err := h.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list the egress router's routing rules: %w", err)
	}
	for _, r := range routeGuard() {
		if slices.ContainsFunc(have, func(h netlink.Rule) bool { return h.Priority == r.Priority }) {
			continue
		}
		if err := h.RuleAdd(r); err != nil {
			return fmt.Errorf("add the routing rule of priority %d: %w", r.Priority, err)
		}
	}
	return nil
}

// delRouteGuard deletes the route guard's rules, with h (nil: the host's).
// The caller holds hostLock.
func delRouteGuard(h *netlink.Handle) error {
	if h == nil {
		var err error
		if h, err = netlink.NewHandle(); err != nil {
			return err
		}
		defer h.Close()
	}
	for _, r := range routeGuard() {
		if err := h.RuleDel(r); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete the routing rule of priority %d: %w", r.Priority, err)
		}
	}
	return nil
}

// natTable is the host's table that masquerades the sandboxes' addresses
// (Range) on their way out of the host, made with the router.
const natTable = "flmbox-nat"

// addHostNAT adds natTable, or makes its chain again.
func addHostNAT() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: natTable})
	policy := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Table: t, Name: "postrouting", Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &policy})
	c.FlushChain(ch)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: slices.Concat(ipv4(), inPrefix(12, Range), oifNot(uplinkHost), []expr.Any{&expr.Masq{}})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables table %s: %w", natTable, err)
	}
	return nil
}

// delHostNAT deletes natTable.
func delHostNAT() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: natTable})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete nftables table %s: %w", natTable, err)
	}
	return nil
}
