package egress

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
)

const ipForward = "/proc/sys/net/ipv4/ip_forward"

// guardTable is the table enableForwarding adds when it turns forwarding
// on: the host forwarded nothing before, and forwards only its egress
// sandboxes' packets after.
const guardTable = "flmbox-forward-guard"

// enableForwarding turns IPv4 forwarding on in the host's network
// namespace if it is off, which egress sandboxes need (as Docker's bridge
// does). A host that did not forward keeps not forwarding anything else:
// in the same step flmbox adds the table guardTable, whose forward chain
// drops what neither comes from nor goes to an egress sandbox's link. The
// table says that flmbox turned forwarding on: restoreForwarding turns it
// off again when the last egress link goes. The caller holds hostLock.
func enableForwarding() error {
	b, err := os.ReadFile(ipForward)
	if err != nil {
		return fmt.Errorf("read %s: %w", ipForward, err)
	}
	if string(bytes.TrimSpace(b)) == "1" {
		return nil
	}
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
	if err := os.WriteFile(ipForward, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("turn IPv4 forwarding on: %w", err)
	}
	return nil
}

// restoreForwarding turns forwarding off and removes guardTable if
// enableForwarding turned it on and no egress sandbox's link is left: the
// host forwards as it did before. The caller holds hostLock.
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
	c, err := nftables.New()
	if err != nil {
		return err
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	if !slices.ContainsFunc(ts, func(t *nftables.Table) bool { return t.Name == guardTable }) {
		return nil // forwarding was on before flmbox
	}
	if err := os.WriteFile(ipForward, []byte("0\n"), 0o644); err != nil {
		return fmt.Errorf("turn IPv4 forwarding off again: %w", err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: guardTable})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete nftables table %s: %w", guardTable, err)
	}
	return nil
}
