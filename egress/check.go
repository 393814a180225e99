package egress

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// Check says whether this host can make egress networks: nftables
// answers, no route of the host's but flmbox's own is in Range, and no
// other table's forward chain drops by default (Docker's does), which
// would drop the sandboxes' packets whatever their policy says. It changes
// nothing; detail says what was found.
func Check() (detail string, err error) {
	c, err := nftables.New()
	if err != nil {
		return "", fmt.Errorf("nftables: %w", err)
	}
	chains, err := c.ListChains()
	if err != nil {
		return "", fmt.Errorf("nftables: list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookForward || ch.Policy == nil ||
			*ch.Policy != nftables.ChainPolicyDrop || ch.Table.Name == guardTable {
			continue
		}
		return "", fmt.Errorf("the forward chain %s of nftables table %s drops by default: it would drop egress sandboxes' packets (accept iifname and oifname %s* there)",
			ch.Name, ch.Table.Name, linkPrefix)
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", fmt.Errorf("list the host's routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		bits, _ := r.Dst.Mask.Size()
		if !ok || bits == 0 || !netip.PrefixFrom(dst, bits).Overlaps(Range) { // a default route takes no range
			continue
		}
		name := ""
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			name = l.Attrs().Name
		}
		if !strings.HasPrefix(name, linkPrefix) {
			return "", fmt.Errorf("the host's route to %s (link %s) overlaps %s, egress sandboxes' addresses", r.Dst, name, Range)
		}
	}
	fwd := "on"
	if b, err := os.ReadFile(ipForward); err == nil && string(bytes.TrimSpace(b)) != "1" {
		fwd = "off (the first egress sandbox turns it on, forwarding nothing else)"
	}
	detail = fmt.Sprintf("nftables answers; addresses from %s; IPv4 forwarding %s", Range, fwd)
	if u, err := user.Lookup(ResolverUser); err == nil {
		detail += fmt.Sprintf("; resolvers run as %s (uid %s)", ResolverUser, u.Uid)
	} else {
		detail += fmt.Sprintf("; resolvers will run as %s, a system user the first egress sandbox makes", ResolverUser)
	}
	if b, err := os.ReadFile("/etc/nftables.conf"); err == nil && bytes.Contains(b, []byte("flush ruleset")) {
		detail += "; note: /etc/nftables.conf flushes the ruleset (a reload of nftables removes every egress sandbox's table: their links go down until the next sandbox command makes them again)"
	}
	return detail, nil
}
