package egress

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "": invalid
	}{
		{"pypi.org", "pypi.org"},
		{"PyPI.org.", "pypi.org"},
		{"*.example.com:443", "*.example.com:443"},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.1.2.3/8", "10.0.0.0/8"},
		{"1.2.3.4", "1.2.3.4"},
		{"1.2.3.4/32:53", "1.2.3.4:53"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"", ""},
		{":80", ""},
		{"host:", ""},
		{"host:0", ""},
		{"host:65536", ""},
		{"host:http", ""},
		{"a..b", ""},
		{"-a.b", ""},
		{"a*.b", ""},
		{"*.*.b", ""},
		{"*", ""},
		{"::1", ""},
		{"[::1]:80", ""},
		{"fd00::/8", ""},
		{"a b", ""},
		{"a/b", ""},
		{"010.0.0.1", ""}, // not an address, and no name
		{"host.123", ""},
		{`evil\.wild.test`, ""},
	} {
		r, err := ParseRule(tc.in)
		if tc.want == "" {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ParseRule(%q) = %v, %v; want an invalid argument", tc.in, r, err)
			}
			continue
		}
		if err != nil || r.String() != tc.want {
			t.Errorf("ParseRule(%q) = %q, %v; want %q", tc.in, r.String(), err, tc.want)
		}
		var back Rule
		if err := back.UnmarshalText([]byte(r.String())); err != nil || back != r {
			t.Errorf("rule %q does not read back: %v, %v", r, back, err)
		}
	}
}

func rules(ss ...string) []Rule {
	var out []Rule
	for _, s := range ss {
		r, err := ParseRule(s)
		if err != nil {
			panic(err)
		}
		out = append(out, r)
	}
	return out
}

func TestNamePorts(t *testing.T) {
	p := Policy{
		Allow: rules("pypi.org", "*.example.com:443", "*.example.com:80", "api.example.com", "x.test:22", "x.test:23", "gone.test"),
		Deny:  rules("bad.example.com", "x.test:22", "gone.test:1"),
	}
	for _, tc := range []struct {
		name          string
		ok            bool
		ports, denied []uint16
	}{
		{"pypi.org", true, nil, nil},
		{"PYPI.ORG.", true, nil, nil},
		{"files.pypi.org", false, nil, nil},
		{"example.com", false, nil, nil},
		{"www.example.com", true, []uint16{443, 80}, nil},
		{"a.b.example.com", true, []uint16{443, 80}, nil},
		{"api.example.com", true, nil, nil},
		{"bad.example.com", false, nil, nil},
		{"x.test", true, []uint16{23}, nil},
		{"gone.test", true, nil, []uint16{1}},
		{"evilexample.com", false, nil, nil},
	} {
		ports, denied, ok := p.NamePorts(tc.name)
		if ok != tc.ok || !slices.Equal(ports, tc.ports) || !slices.Equal(denied, tc.denied) {
			t.Errorf("NamePorts(%q) = %v, %v, %v; want %v, %v, %v", tc.name, ports, denied, ok, tc.ports, tc.denied, tc.ok)
		}
	}
}

func TestAnswerAllowed(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("203.0.113.2")}
	p := Policy{Allow: rules("0.0.0.0/0", "10.1.0.0/16", "169.254.169.254:80"), Deny: rules("198.51.100.0/24")}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"8.8.8.8", true},
		{"198.51.100.7", false},   // denied
		{"10.2.0.1", false},       // private: 0.0.0.0/0 does not name it
		{"10.1.2.3", true},        // named by a range inside 10/8
		{"169.254.169.254", true}, // named explicitly
		{"169.254.1.1", false},
		{"127.0.0.1", false},
		{"192.168.1.1", false},
		{"100.64.0.1", false},
		{"224.0.0.1", false},
		{"168.63.129.16", false}, // Azure's WireServer
		{"203.0.113.2", false},   // the host's
		{"::1", false},
		{"2001:db8::1", false},
	} {
		if got := p.AnswerAllowed(netip.MustParseAddr(tc.addr), host); got != tc.ok {
			t.Errorf("AnswerAllowed(%s) = %v, want %v", tc.addr, got, tc.ok)
		}
	}
}

func TestHostLink(t *testing.T) {
	got := HostLink("flmbox-9f88d6d209f128458e69440d")
	if got != "flmb9f88d6d209f" || len(got) > 15 {
		t.Fatalf("HostLink = %q", got)
	}
}

func TestNarrow(t *testing.T) {
	op := Policy{Allow: rules("*.example.com", "pypi.org:443", "10.0.0.0/8", "1.2.3.4"), Deny: rules("bad.example.com")}
	for _, tc := range []struct {
		allow []string
		ok    bool
	}{
		{nil, true},
		{[]string{"www.example.com"}, true},
		{[]string{"*.a.example.com:80"}, true},
		{[]string{"*.example.com"}, true},
		{[]string{"example.com"}, false},
		{[]string{"pypi.org:443"}, true},
		{[]string{"pypi.org"}, false},
		{[]string{"pypi.org:80"}, false},
		{[]string{"10.1.0.0/16:22"}, true},
		{[]string{"0.0.0.0/0"}, false},
		{[]string{"1.2.3.4:80"}, true},
		{[]string{"1.2.3.0/24"}, false},
		{[]string{"www.example.com", "evil.org"}, false},
	} {
		got, err := op.Narrow(Policy{Allow: rules(tc.allow...), Deny: rules("x.example.com")})
		if (err == nil) != tc.ok {
			t.Errorf("Narrow(%v) = %v; want ok %v", tc.allow, err, tc.ok)
			continue
		}
		if err != nil {
			continue
		}
		if len(got.Deny) != 2 || (tc.allow == nil && len(got.Allow) != len(op.Allow)) {
			t.Errorf("Narrow(%v) = %+v", tc.allow, got)
		}
	}
}

// TestChainPorts: an answer through CNAMEs opens the ports the asked name's
// Allow rules give, less those the Deny rules of any name of the chain
// close; a Deny without a port on any of them closes it.
func TestChainPorts(t *testing.T) {
	p := Policy{Allow: rules("*.corp.test", "mail.other.test:25", "mail.other.test:587"),
		Deny: rules("admin.corp.test:80", "admin.corp.test:443", "relay.test:25", "evil.test")}
	for _, tc := range []struct {
		host          string
		chain         []string
		ports, denied []uint16
		ok            bool
	}{
		{"www.corp.test", nil, nil, nil, true},
		{"www.corp.test", []string{"www.corp.test", "admin.corp.test"}, nil, []uint16{80, 443}, true},
		{"www.corp.test", []string{"cdn.example"}, nil, nil, true}, // a name no rule names closes nothing
		{"www.corp.test", []string{"evil.test"}, nil, nil, false},
		{"mail.other.test", []string{"relay.test"}, []uint16{587}, nil, true},
		{"mail.other.test", []string{"relay.test", "admin.corp.test"}, []uint16{587}, nil, true},
		{"other.test", nil, nil, nil, false},
	} {
		ports, denied, ok := p.ChainPorts(tc.host, tc.chain)
		if ok != tc.ok || !slices.Equal(ports, tc.ports) || !slices.Equal(denied, tc.denied) {
			t.Errorf("ChainPorts(%s, %v) = %v, %v, %v; want %v, %v, %v", tc.host, tc.chain, ports, denied, ok, tc.ports, tc.denied, tc.ok)
		}
	}
	if all, ports := p.DeniedPorts("ADMIN.corp.test."); all || !slices.Equal(ports, []uint16{80, 443}) {
		t.Errorf("DeniedPorts(admin) = %v, %v", all, ports)
	}
}

// TestRefusalClassOf: each reserved range has its class, and a rule's
// comment reads back as written (nft list shows it as comment "...").
func TestRefusalClassOf(t *testing.T) {
	want := map[string]string{"169.254.0.0/16": ClassMetadata, "168.63.129.16/32": ClassMetadata, "127.0.0.0/8": ClassLoopback,
		"10.0.0.0/8": ClassPrivate, "100.64.0.0/10": ClassPrivate, "172.16.0.0/12": ClassPrivate, "192.168.0.0/16": ClassPrivate,
		"0.0.0.0/8": ClassReserved, "224.0.0.0/3": ClassReserved, "198.18.0.0/15": ClassReserved, "192.0.0.0/24": ClassReserved}
	for _, p := range Reserved {
		if got := reservedClass(p); got != want[p.String()] {
			t.Errorf("reservedClass(%s) = %q, want %q", p, got, want[p.String()])
		}
	}
	for _, s := range []string{ClassMetadata, ClassTooManyFlows, ""} {
		if got := commentOf(ruleComment(s)); got != s {
			t.Errorf("commentOf(ruleComment(%q)) = %q", s, got)
		}
	}
	if got := commentOf([]byte{7, 2, 1, 2, 0, 4, 'h', 'o', 's', 't'}); got != "host" {
		t.Errorf("a comment after another attribute: %q", got)
	}
}
