package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A sandbox's policy is one nftables table of its own, family inet, in the
// host's network namespace (where code in the sandbox cannot reach it):
// removing the table removes every rule, set and counter of the sandbox at
// once, and tables of different sandboxes never meet. Its chains:
//
//	forward (hook forward): from the sandbox's link, jump to out; to it,
//	  only packets of connections it opened (ct established, related).
//	out: a source address not the sandbox's is dropped; established and
//	  related pass; IPv6 is refused; then, in order: Deny rules
//	  refuse, Allow ranges inside Reserved pass, Reserved refuses, the
//	  addresses the resolver answered (sets pin and pinport, with a
//	  timeout) and the other Allow ranges pass, the rest is refused.
//	  What passes is TCP and UDP only: ICMP (ping) is always refused.
//	input (hook input): from the sandbox's link only DNS to the gateway,
//	  and only to a socket marked ResolverMark (the sandbox's resolver's);
//	  the router's every other address is refused.
//	mark (hook prerouting): the link's packets are marked (addRouteGuard).
//
// The table lives in the router (router.go); the host masquerades Range.
//
// A refusal is counted in the set refused (destination . protocol . port,
// a counter per element) and answered at once: a TCP reset, an ICMP port
// unreachable for the rest, so that code fails fast and says why.

// Set names in a sandbox's table.
const (
	setPin      = "pin"      // ipv4_addr: answers of names allowed on every port
	setPinPort  = "pinport"  // ipv4_addr . inet_service: answers of names allowed on some ports
	setDenyPort = "denyport" // ipv4_addr . inet_service: answers of names denied on some ports
	setRefused  = "refused"  // ipv4_addr . inet_proto . inet_service, counters
	setHost     = "host"     // ipv4_addr: the host's addresses (the router forwards to them)
	refusedSize = 4096       // elements refused keeps; refusals past it are counted in total only
	maxFlows    = 4096       // connections a sandbox may have tracked at once (chain full)
	refusedFor  = time.Hour  // how long refused keeps a destination after its last refusal
	pinSize     = 65536      // elements each pin set keeps: a full set fails the pin (SERVFAIL), not open
	chainOut    = "out"
	chainFull   = "full" // refuses a connection past maxFlows
)

// nftables' 32-bit registers, for concatenations.
const (
	reg0 = 8 + iota // NFT_REG32_00
	reg1
	reg2
)

// TableName is the name of the nftables table of the sandbox whose runsc
// ID is id.
func TableName(id string) string { return id }

var (
	pinType     = nftables.TypeIPAddr
	pinPortType = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
	refusedType = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
)

// rules builds a sandbox's table, chains, sets and rules into c.
func (n *Network) rules(c *nftables.Conn, p Policy) error {
	_, err := n.build(c, p, hostElements())
	return err
}

// ruleCounts are how many rules each chain of the sandbox's table has when
// it is whole: what checkTable compares the kernel's with.
func (n *Network) ruleCounts(p Policy) (map[string]int, error) {
	c, err := nftables.New() // built, never sent
	if err != nil {
		return nil, err
	}
	return n.build(c, p, nil) // the host set's elements are no rules
}

// checkTable compares the rules of each chain of the sandbox's table in
// the kernel with what the policy builds: a table flushed (nft flush table),
// a chain flushed or gone, a rule deleted. It returns nil if the table is
// whole, an error wrapping errTableChanged if not.
func (n *Network) checkTable(c *nftables.Conn, p Policy) error {
	want, err := n.ruleCounts(p)
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(n.ID)}
	for chain, count := range want {
		rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
		switch {
		case errors.Is(err, unix.ENOENT):
			return fmt.Errorf("table %s: chain %s is gone: %w", t.Name, chain, errTableChanged)
		case err != nil:
			return fmt.Errorf("table %s: list the rules of chain %s: %w", t.Name, chain, err)
		case len(rules) != count:
			return fmt.Errorf("table %s: chain %s has %d rules, the policy %d: %w", t.Name, chain, len(rules), count, errTableChanged)
		}
	}
	return nil
}

// inetTable returns the inet table named name, nil if there is none.
func inetTable(c *nftables.Conn, name string) (*nftables.Table, error) {
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	if i := slices.IndexFunc(ts, func(t *nftables.Table) bool { return t.Name == name }); i >= 0 {
		return ts[i], nil
	}
	return nil, nil
}

// errTableChanged says that a sandbox's table is not what its policy made.
var errTableChanged = errors.New("the sandbox's nftables table was changed")

// build is rules, and counts the rules of each chain.
// hostElems are the set host's elements (hostElements).
func (n *Network) build(c *nftables.Conn, p Policy, hostElems []nftables.SetElement) (map[string]int, error) {
	counts := map[string]int{}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(n.ID)})
	pin := &nftables.Set{Table: t, Name: setPin, KeyType: pinType, HasTimeout: true, Size: pinSize}
	pinPort := &nftables.Set{Table: t, Name: setPinPort, KeyType: pinPortType, HasTimeout: true, Concatenation: true, Size: pinSize}
	denyPort := &nftables.Set{Table: t, Name: setDenyPort, KeyType: pinPortType, HasTimeout: true, Concatenation: true, Size: pinSize}
	// A refused destination is kept refusedFor since its last refusal:
	// a scan that filled the set leaves room for later ones (the counts
	// of each class are the rules' counters, which never saturate).
	refused := &nftables.Set{Table: t, Name: setRefused, KeyType: refusedType, Concatenation: true,
		Dynamic: true, Counter: true, Size: refusedSize, HasTimeout: true, Timeout: refusedFor}
	for _, s := range []*nftables.Set{pin, pinPort, denyPort, refused} {
		if err := c.AddSet(s, nil); err != nil {
			return nil, err
		}
	}
	host := &nftables.Set{Table: t, Name: setHost, KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(host, hostElems); err != nil {
		return nil, err
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	policy := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Table: t, Name: "forward", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	out := c.AddChain(&nftables.Chain{Table: t, Name: chainOut})
	in := c.AddChain(&nftables.Chain{Table: t, Name: "input", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	// Every packet of the sandbox's link is marked before it is routed:
	// the router's routing policy forwards a packet from Range only marked
	// (see addRouteGuard), so a table flushed or gone forwards nothing.
	pre := c.AddChain(&nftables.Chain{Table: t, Name: "mark", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &policy})
	// tagged adds a rule whose comment names the class of what it
	// refuses (RefusalClasses sums its counter into it).
	tagged := func(ch *nftables.Chain, class string, e ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: slices.Concat(e...), UserData: ruleComment(class)})
		counts[ch.Name]++
	}
	add := func(ch *nftables.Chain, e ...[]expr.Any) { tagged(ch, "", e...) }
	v := func(e expr.Any) []expr.Any { return []expr.Any{e} }

	add(fwd, iif(n.Host), v(&expr.Verdict{Kind: expr.VerdictJump, Chain: chainOut}))
	add(fwd, oif(n.Host), ctEstablished(), v(accept))
	add(fwd, oif(n.Host), v(drop))

	// allow adds rules accepting TCP and UDP that match matches, on port p
	// (any if 0): an Allow rule opens those two protocols only (ICMP is
	// refused).
	allow := func(ch *nftables.Chain, p uint16, match ...[]expr.Any) {
		for _, proto := range ported {
			add(ch, slices.Concat(match...), l4proto(proto), dportOr(p), v(accept))
		}
	}
	// refuse adds rules refusing what match matches on port p (any if 0),
	// and counting it in the set refused. The set's update and the verdict
	// are two rules: a full set fails its own rule, never the refusal.
	refuse := func(ch *nftables.Chain, class string, p uint16, match ...[]expr.Any) {
		m := slices.Concat(match...)
		for _, proto := range ported {
			add(ch, m, l4proto(proto), dportOr(p), ipv4(), refusedKey(true), v(&expr.Dynset{SrcRegKey: reg0, SetName: refused.Name, Operation: unix.NFT_DYNSET_OP_UPDATE}))
		}
		if p == 0 {
			add(ch, m, notPorted(), ipv4(), refusedKey(false), v(&expr.Dynset{SrcRegKey: reg0, SetName: refused.Name, Operation: unix.NFT_DYNSET_OP_UPDATE}))
		}
		tagged(ch, class, m, l4proto(unix.IPPROTO_TCP), dportOr(p), v(&expr.Counter{}), v(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
		if p != 0 {
			tagged(ch, class, m, l4proto(unix.IPPROTO_UDP), dportOr(p), v(&expr.Counter{}), v(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}))
			return
		}
		tagged(ch, class, m, v(&expr.Counter{}), v(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}))
	}
	// A source not the sandbox's is dropped first: a spoofed packet must
	// not pass as another sandbox's established connection.
	add(out, ipv4(), saddrNot(n.Addr), v(drop))
	add(out, ctEstablished(), v(accept))
	// A sandbox holds at most maxFlows connections in the host's
	// connection tracking (each UDP datagram to a new port is one, for 30
	// s): past it, a new one is refused (chain full), not tracked.
	full := c.AddChain(&nftables.Chain{Table: t, Name: chainFull})
	add(out, v(&expr.Connlimit{Count: maxFlows, Flags: expr.NFT_CONNLIMIT_F_INV}), v(&expr.Verdict{Kind: expr.VerdictJump, Chain: chainFull}))
	tagged(out, ClassIPv6, nfproto(unix.NFPROTO_IPV6), v(&expr.Counter{}), v(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}))
	for _, r := range p.Deny {
		if r.Name == "" {
			refuse(out, ClassDenied, r.Port, ipv4(), daddrIn(r.Prefix))
		}
	}
	for _, proto := range ported {
		refuse(out, ClassDenied, 0, ipv4(), l4proto(proto), daddr(reg0), dport(reg1), []expr.Any{&expr.Lookup{SourceRegister: reg0, SetName: denyPort.Name}})
	}
	// The host's own addresses are refused unless an Allow names one by
	// itself (a /32): the router forwards to them as to any address.
	for _, r := range p.Allow {
		if r.Name == "" && r.Prefix.Bits() == 32 {
			allow(out, r.Port, ipv4(), daddrIn(r.Prefix))
		}
	}
	refuse(out, ClassHost, 0, ipv4(), daddr(reg1), []expr.Any{&expr.Lookup{SourceRegister: reg1, SetName: host.Name}})
	for _, r := range p.Allow {
		if r.Name == "" && r.explicit() {
			allow(out, r.Port, ipv4(), daddrIn(r.Prefix))
		}
	}
	for _, pr := range Reserved {
		refuse(out, reservedClass(pr), 0, ipv4(), daddrIn(pr))
	}
	for _, proto := range ported {
		add(out, ipv4(), l4proto(proto), daddr(reg1), v(&expr.Lookup{SourceRegister: reg1, SetName: pin.Name}), v(accept))
	}
	for _, proto := range ported {
		add(out, ipv4(), l4proto(proto), daddr(reg0), dport(reg1), v(&expr.Lookup{SourceRegister: reg0, SetName: pinPort.Name}), v(accept))
	}
	for _, r := range p.Allow {
		if r.Name == "" && !r.explicit() {
			allow(out, r.Port, ipv4(), daddrIn(r.Prefix))
		}
	}
	refuse(out, ClassNotAllowed, 0)
	refuse(full, ClassTooManyFlows, 0)

	// Spoofed sources are dropped here too: the resolver's answers must
	// not be sent to a third party (a reflection).
	add(in, iif(n.Host), ipv4(), saddrNot(n.Addr), v(drop))
	// A TCP connection's packets after its SYN (which met the resolver's
	// listening socket) meet a request or connected socket, whose mark
	// nftables cannot read: they pass as established.
	add(in, iif(n.Host), ipv4(), daddrIn(netip.PrefixFrom(n.Gateway, 32)), ctEstablished(), v(accept))
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		add(in, iif(n.Host), ipv4(), daddrIn(netip.PrefixFrom(n.Gateway, 32)), l4proto(proto), dportIs(53), resolverSocket(), v(accept))
	}
	refuse(in, ClassHost, 0, iif(n.Host))

	mark := binary.NativeEndian.AppendUint32(nil, routeMark)
	add(pre, iif(n.Host), v(&expr.Immediate{Register: 1, Data: mark}), v(&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}))
	return counts, nil
}

func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func iif(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)}}
}

func oif(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)}}
}

func oifNot(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(name)}}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func ipv4() []expr.Any { return nfproto(unix.NFPROTO_IPV4) }

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// addr loads the IPv4 source (offset 12) or destination (16) into reg.
func addr(offset, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
}

func daddr(reg uint32) []expr.Any { return []expr.Any{addr(16, reg)} }

func dport(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
}

func inPrefix(offset uint32, p netip.Prefix) []expr.Any {
	a := p.Addr().As4()
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = make([]byte, 4)
	}
	return []expr.Any{addr(offset, 1),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]}}
}

func daddrIn(p netip.Prefix) []expr.Any { return inPrefix(16, p) }

func saddrIs(a netip.Addr) []expr.Any { return inPrefix(12, netip.PrefixFrom(a, 32)) }

func saddrNot(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{addr(12, 1), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: b[:]}}
}

func dportIs(p uint16) []expr.Any {
	return append(dport(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, p)})
}

// ResolverMark marks the sockets of a sandbox's resolver (SO_MARK): DNS
// from the sandbox reaches only a socket so marked, never another service
// of the host's on port 53 (while its resolver is not running, say).
const ResolverMark = 0x666c6d62 // "flmb"

// resolverSocket matches packets whose socket on the host carries
// ResolverMark.
func resolverSocket() []expr.Any {
	return []expr.Any{&expr.Socket{Key: expr.SocketKeyMark, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, ResolverMark)}}
}

// ported are the protocols with ports.
var ported = []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP}

// notPorted matches protocols without ports.
func notPorted() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.IPPROTO_UDP}}}
}

// dportOr matches destination port p, or any if p is 0.
func dportOr(p uint16) []expr.Any {
	if p == 0 {
		return nil
	}
	return dportIs(p)
}

// refusedKey loads destination . protocol . port into reg0..reg2: the
// transport header's port if withPort, else 0.
func refusedKey(withPort bool) []expr.Any {
	port := expr.Any(&expr.Immediate{Register: reg2, Data: []byte{0, 0, 0, 0}})
	if withPort {
		port = &expr.Payload{DestRegister: reg2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	}
	return []expr.Any{addr(16, reg0), &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, port}
}

// pinTimeout bounds how long an answered address stays reachable: at least
// minPin (clients cache answers past their TTL), at most maxPin.
const (
	minPin = 5 * time.Minute
	maxPin = 24 * time.Hour
)

func pinTimeout(ttl time.Duration) time.Duration { return min(max(ttl, minPin), maxPin) }

// pin makes addrs reachable on ports (nil: every port) and unreachable on
// denied, for the sandbox whose table is table, for pinTimeout(ttl).
func pin(c *nftables.Conn, table string, addrs []netip.Addr, ports, denied []uint16, ttl time.Duration) error {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: table}
	timeout := pinTimeout(ttl)
	ported := func(set string, ports []uint16) error {
		var elems []nftables.SetElement
		for _, a := range addrs {
			b := a.As4()
			for _, p := range ports {
				key := append(b[:], 0, 0, 0, 0)
				binary.BigEndian.PutUint16(key[4:], p)
				elems = append(elems, nftables.SetElement{Key: key, Timeout: timeout})
			}
		}
		if len(elems) == 0 {
			return nil
		}
		return c.SetAddElements(&nftables.Set{Table: t, Name: set, KeyType: pinPortType, HasTimeout: true}, elems)
	}
	if err := ported(setDenyPort, denied); err != nil {
		return err
	}
	if ports != nil {
		if err := ported(setPinPort, ports); err != nil {
			return err
		}
	} else {
		var elems []nftables.SetElement
		for _, a := range addrs {
			b := a.As4()
			elems = append(elems, nftables.SetElement{Key: b[:], Timeout: timeout})
		}
		if err := c.SetAddElements(&nftables.Set{Table: t, Name: setPin, KeyType: pinType, HasTimeout: true}, elems); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("pin %v in table %s: %w", addrs, table, err)
	}
	return nil
}

// hostElements are the host's IPv4 addresses, for the set host, read in
// the host's namespace (Create, Ensure).
func hostElements() []nftables.SetElement {
	var out []nftables.SetElement
	for _, a := range hostAddrs() {
		b := a.As4()
		out = append(out, nftables.SetElement{Key: b[:]})
	}
	return out
}

// refreshHostAddrs makes the table's set host the host's addresses now (an
// address the host got since its create).
func (n *Network) refreshHostAddrs(c *nftables.Conn) error {
	set := &nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(n.ID)}, Name: setHost, KeyType: nftables.TypeIPAddr}
	c.FlushSet(set)
	if elems := hostElements(); len(elems) > 0 {
		if err := c.SetAddElements(set, elems); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("refresh the host's addresses in table %s: %w", TableName(n.ID), err)
	}
	return nil
}
