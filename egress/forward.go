package egress

import (
	"bytes"
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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
// drops what neither comes from nor goes to an egress sandbox's link. It
// is never removed (it says what the host forwarded before flmbox).
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
