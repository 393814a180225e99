package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// Rule names destinations: a host name, a wildcard domain, an address or a
// range, each on one port or all of them. Its text form (String, ParseRule)
// is HOST, *.DOMAIN, IP or CIDR, optionally followed by :PORT.
type Rule struct {
	// Name is a lower-case host name without a trailing dot, or
	// "*.DOMAIN" for every name under DOMAIN (not DOMAIN itself); empty
	// for a Prefix rule.
	Name string
	// Prefix is the IPv4 range the rule names; invalid for a Name rule.
	Prefix netip.Prefix
	// Port is the TCP or UDP port the rule allows or denies; 0: all ports
	// and protocols.
	Port uint16
}

// ParseRule parses HOST, *.DOMAIN, IP or CIDR, each optionally followed by
// :PORT (errdefs.ErrInvalidArgument otherwise). Only IPv4 addresses and
// ranges: a sandbox has no IPv6.
func ParseRule(s string) (Rule, error) {
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("egress rule %q: %s: %w", s, why, errdefs.ErrInvalidArgument)
	}
	host, port := s, ""
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, port = s[:i], s[i+1:]
		if strings.Contains(host, ":") {
			return bad("IPv6 is not supported (a sandbox has no IPv6 address)")
		}
	}
	var r Rule
	if port != "" || strings.HasSuffix(s, ":") {
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			return bad("want a port from 1 to 65535 after ':'")
		}
		r.Port = uint16(p)
	}
	if p, err := netip.ParsePrefix(host); err == nil {
		if !p.Addr().Is4() {
			return bad("IPv6 is not supported (a sandbox has no IPv6 address)")
		}
		r.Prefix = p.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return bad("IPv6 is not supported (a sandbox has no IPv6 address)")
		}
		r.Prefix = netip.PrefixFrom(a, 32)
		return r, nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if !validName(strings.TrimPrefix(name, "*.")) || strings.Contains(strings.TrimPrefix(name, "*."), "*") {
		return bad("want a host name, *.domain, an IPv4 address or a CIDR")
	}
	if last := name[strings.LastIndexByte(name, '.')+1:]; strings.Trim(last, "0123456789") == "" {
		return bad("not an IPv4 address, and not a host name (its last label is a number)")
	}
	r.Name = name
	return r, nil
}

// validName reports whether name is a host name: dot-separated labels of
// letters, digits, '-' and '_', 1 to 63 bytes each, 253 in all.
func validName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// String returns r in the form ParseRule reads.
func (r Rule) String() string {
	s := r.Name
	if s == "" {
		s = r.Prefix.String()
		if r.Prefix.Bits() == 32 {
			s = r.Prefix.Addr().String()
		}
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	return s
}

// MarshalText returns r's text form.
func (r Rule) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText parses r's text form.
func (r *Rule) UnmarshalText(b []byte) error {
	x, err := ParseRule(string(b))
	*r = x
	return err
}

// matchName reports whether r names host (lower case, no trailing dot).
func (r Rule) matchName(host string) bool {
	if d, ok := strings.CutPrefix(r.Name, "*."); ok {
		return strings.HasSuffix(host, "."+d)
	}
	return r.Name != "" && r.Name == host
}

// Policy is where a sandbox may connect: nowhere but what Allow names and
// Deny does not. Reserved ranges (Reserved) and the host's own addresses are
// reached only through an Allow range inside them; a name's answers in
// them are dropped.
type Policy struct {
	Allow []Rule `json:"allow,omitempty"`
	Deny  []Rule `json:"deny,omitempty"`
	// DNS are the servers the sandbox's resolver asks; empty: the host's
	// (its /etc/resolv.conf).
	DNS []netip.Addr `json:"dns,omitempty"`
}

// Reserved are the ranges an egress sandbox reaches only through an Allow
// range inside them: this network, loopback, link-local (the cloud's
// metadata service), the private and shared ranges, multicast and the rest
// of class E.
var Reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("168.63.129.16/32"), // Azure's WireServer, the host agent's endpoint
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

// reserved reports whether a is in Reserved.
func reserved(a netip.Addr) bool {
	return slices.ContainsFunc(Reserved, func(p netip.Prefix) bool { return p.Contains(a) })
}

// explicit reports whether r is a range inside Reserved, which only such a
// rule opens.
func (r Rule) explicit() bool {
	return r.Name == "" && slices.ContainsFunc(Reserved, func(p netip.Prefix) bool {
		return p.Bits() <= r.Prefix.Bits() && p.Contains(r.Prefix.Addr())
	})
}

// NamePorts reports whether host may be resolved, the ports its answers
// open (nil with ok: every port) and those they close (Deny name rules
// with a port, which beat an Allow of every port). A Deny name rule without
// a port closes the name.
func (p Policy) NamePorts(host string) (ports, denied []uint16, ok bool) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	all := false
	for _, r := range p.Allow {
		if !r.matchName(host) {
			continue
		}
		ok = true
		if r.Port == 0 {
			all = true
		} else if !slices.Contains(ports, r.Port) {
			ports = append(ports, r.Port)
		}
	}
	for _, r := range p.Deny {
		switch {
		case !r.matchName(host):
		case r.Port == 0:
			return nil, nil, false
		case !slices.Contains(denied, r.Port):
			denied = append(denied, r.Port)
		}
	}
	if all {
		return nil, denied, ok
	}
	ports = slices.DeleteFunc(ports, func(port uint16) bool { return slices.Contains(denied, port) })
	return ports, nil, ok && len(ports) > 0
}

// Denied reports whether a Deny rule closes host, a name, on every port.
func (p Policy) Denied(host string) bool {
	all, _ := p.DeniedPorts(host)
	return all
}

// DeniedPorts reports whether a Deny rule closes host, a name, on every
// port, and else the ports Deny rules close it on.
func (p Policy) DeniedPorts(host string) (all bool, ports []uint16) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, r := range p.Deny {
		switch {
		case !r.matchName(host):
		case r.Port == 0:
			return true, nil
		case !slices.Contains(ports, r.Port):
			ports = append(ports, r.Port)
		}
	}
	return false, ports
}

// ChainPorts is NamePorts of a name whose answer went through chain, the
// names of its CNAMEs: the ports come from host's Allow rules, and the Deny
// rules of every name of the chain close theirs (a Deny without a port on
// any of them closes the answer). A name of the chain that no rule names
// does not close it: a name's CNAME is its owner's choice (a CDN's).
func (p Policy) ChainPorts(host string, chain []string) (ports, denied []uint16, ok bool) {
	ports, denied, ok = p.NamePorts(host)
	if !ok {
		return nil, nil, false
	}
	for _, n := range chain {
		all, d := p.DeniedPorts(n)
		if all {
			return nil, nil, false
		}
		for _, port := range d {
			if !slices.Contains(denied, port) {
				denied = append(denied, port)
			}
		}
	}
	if ports == nil {
		return nil, denied, true // every port but the denied ones
	}
	ports = slices.DeleteFunc(slices.Clone(ports), func(port uint16) bool { return slices.Contains(denied, port) })
	return ports, nil, len(ports) > 0
}

// AnswerAllowed reports whether a, a resolved name's address, may be
// pinned: not denied, and not reserved (or in host) unless an Allow range
// inside them names it.
func (p Policy) AnswerAllowed(a netip.Addr, host []netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	for _, r := range p.Deny {
		if r.Name == "" && r.Port == 0 && r.Prefix.Contains(a) {
			return false
		}
	}
	if !reserved(a) && !slices.Contains(host, a) {
		return true
	}
	return slices.ContainsFunc(p.Allow, func(r Rule) bool { return r.explicit() && r.Prefix.Contains(a) })
}

// Validate checks p: at least one server per DNS entry's family (IPv4).
func (p Policy) Validate() error {
	for _, a := range p.DNS {
		if !a.Is4() {
			return fmt.Errorf("egress DNS server %s: only IPv4 servers: %w", a, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Within reports whether r names nothing that o does not: the same or a
// narrower name or range, on o's port if o has one.
func (r Rule) Within(o Rule) bool {
	if o.Port != 0 && r.Port != o.Port {
		return false
	}
	switch {
	case r.Name == "" && o.Name == "":
		return o.Prefix.Bits() <= r.Prefix.Bits() && o.Prefix.Contains(r.Prefix.Addr())
	case r.Name == "" || o.Name == "":
		return false
	case r.Name == o.Name:
		return true
	}
	d, ok := strings.CutPrefix(o.Name, "*.")
	return ok && strings.HasSuffix(strings.TrimPrefix(r.Name, "*."), "."+d)
}

// Narrow returns the policy that allows what both p (the most a caller may
// have) and n (what it asks for) allow: n's Allow, each of which must lie
// within one of p's (errdefs.ErrInvalidArgument naming the first that does
// not), or p's if n has none; and both Deny lists. DNS servers are p's.
func (p Policy) Narrow(n Policy) (Policy, error) {
	out := Policy{Allow: p.Allow, Deny: slices.Concat(p.Deny, n.Deny), DNS: p.DNS}
	if len(n.Allow) > 0 {
		for _, r := range n.Allow {
			if !slices.ContainsFunc(p.Allow, r.Within) {
				return p, fmt.Errorf("egress rule %s: not within what is allowed (%s): %w", r, rulesString(p.Allow), errdefs.ErrInvalidArgument)
			}
		}
		out.Allow = n.Allow
	}
	return out, nil
}

func rulesString(rs []Rule) string {
	if len(rs) == 0 {
		return "nothing"
	}
	var ss []string
	for _, r := range rs {
		ss = append(ss, r.String())
	}
	return strings.Join(ss, ", ")
}
