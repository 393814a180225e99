package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
)

// upstream serves names → addresses (A and AAAA) on 127.0.0.1 over UDP;
// asked counts the questions it was asked for a name.
func upstream(t *testing.T, names map[string][]string) (addr string, asked func(name string) int) {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int{}
	asked = func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return counts[name]
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		name := q.Question[0].Name
		mu.Lock()
		counts[strings.ToLower(name)]++
		if opt := q.IsEdns0(); opt != nil && len(opt.Option) > 0 || q.Question[0].Qclass != dns.ClassINET || q.Question[0].Qtype != dns.TypeA {
			counts["relayed"]++ // not the resolver's own query
		}
		mu.Unlock()
		// What a resolver must not pass on: records of other types, in
		// every section.
		txt := func(n string) dns.RR {
			return &dns.TXT{Hdr: dns.RR_Header{Name: n, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{"data"}}
		}
		m.Answer = append(m.Answer, txt(name))
		m.Extra = append(m.Extra, txt(name))
		ips, ok := names[strings.ToLower(name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		owner := name
		for _, ip := range ips {
			if target, ok := strings.CutPrefix(ip, "CNAME "); ok { // the rest are target's
				m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: target})
				owner = target
				continue
			}
			if extra, ok := strings.CutPrefix(ip, "EXTRA "); ok { // the name's address, in the additional section
				a := netip.MustParseAddr(extra)
				m.Extra = append(m.Extra, &dns.A{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: a.AsSlice()})
				continue
			}
			if other, ok := strings.CutPrefix(ip, "OTHER "); ok { // an address of another name
				owner, ip = "x.evil.", other
			}
			a := netip.MustParseAddr(ip)
			hdr := dns.RR_Header{Name: owner, Class: dns.ClassINET, Ttl: 60}
			switch {
			case a.Is4() && q.Question[0].Qtype == dns.TypeA:
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case a.Is6() && q.Question[0].Qtype == dns.TypeAAAA:
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String(), asked
}

func setElements(t *testing.T, c *nftables.Conn, table, set string) int {
	t.Helper()
	elems, err := c.GetSetElements(&nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: table}, Name: set,
		KeyType: map[string]nftables.SetDatatype{setPin: pinType, setPinPort: pinPortType, setDenyPort: pinPortType}[set]})
	if err != nil {
		t.Fatal(err)
	}
	return len(elems)
}

// TestResolverAnswers: what a sandbox's resolver answers, asks upstream,
// pins and counts.
func TestResolverAnswers(t *testing.T) {
	if !inPrivateNetNS(t) {
		return
	}
	id := "flmbox-4123456789abcdef01234567"
	p := Policy{Allow: rules("allowed.test", "ported.test:443", "*.wild.test", "private.test", "10.9.0.0/16", "smtp.test:25"),
		Deny: rules("bad.wild.test", "allowed.test:25", "admin.wild.test:80", "mail.test:25")}
	n, err := Create(context.Background(), id, filepath.Join(t.TempDir(), "netns"), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(n.ID, n.NetNS) })
	up, asked := upstream(t, map[string][]string{
		"allowed.test.":    {"198.51.100.10", "2001:db8::1"},
		"ported.test.":     {"198.51.100.11"},
		"a.wild.test.":     {"198.51.100.12"},
		"bad.wild.test.":   {"198.51.100.13"},
		"private.test.":    {"10.1.2.3", "169.254.169.254"},
		"inrange.test.":    {"10.9.1.1"},
		"other.test.":      {"198.51.100.14"},
		"alias.wild.test.": {"CNAME bad.wild.test.", "198.51.100.13"},
		"cdn.wild.test.":   {"CNAME edge.cdn.example.", "198.51.100.15"},
		"stray.wild.test.": {"198.51.100.16", "OTHER 198.51.100.17"},
		"www.wild.test.":   {"CNAME admin.wild.test.", "198.51.100.18"},
		"smtp.test.":       {"CNAME mail.test.", "198.51.100.21"},
		"extra.wild.test.": {"198.51.100.19", "EXTRA 198.51.100.20"},
	})
	c := routerNft(t)
	cfg := ResolverConfig{Table: TableName(id), Gateway: n.Gateway, Policy: p, Upstream: []string{up}}
	g := &guard{cfg: cfg, nft: c}
	r := &resolver{cfg: cfg, refused: map[string]int{}, busy: make(chan struct{}, maxQuestions), pinner: g.pin}
	ask := func(name string, qtype uint16) *dns.Msg {
		q := new(dns.Msg).SetQuestion(name, qtype)
		return r.answer(q)
	}
	for _, tc := range []struct {
		name   string
		qtype  uint16
		rcode  int
		answer int
	}{
		{"allowed.test.", dns.TypeA, dns.RcodeSuccess, 1},
		{"ALLOWED.test.", dns.TypeA, dns.RcodeSuccess, 1},
		{"allowed.test.", dns.TypeAAAA, dns.RcodeSuccess, 0}, // no IPv6
		{"ported.test.", dns.TypeA, dns.RcodeSuccess, 1},
		{"a.wild.test.", dns.TypeA, dns.RcodeSuccess, 1},
		{"bad.wild.test.", dns.TypeA, dns.RcodeNameError, 0}, // denied: never asked
		{"wild.test.", dns.TypeA, dns.RcodeNameError, 0},     // *.wild.test is not wild.test
		{"other.test.", dns.TypeA, dns.RcodeNameError, 0},
		{"private.test.", dns.TypeA, dns.RcodeNameError, 0},    // every answer reserved
		{"alias.wild.test.", dns.TypeA, dns.RcodeNameError, 0}, // through a denied name
		{"cdn.wild.test.", dns.TypeA, dns.RcodeSuccess, 2},     // CNAME and A: through a name no rule names
		{"stray.wild.test.", dns.TypeA, dns.RcodeSuccess, 1},   // another name's address dropped
		{"www.wild.test.", dns.TypeA, dns.RcodeSuccess, 2},     // through admin.wild.test, whose port 80 is denied
		{"extra.wild.test.", dns.TypeA, dns.RcodeSuccess, 1},   // its additional address neither sent nor pinned
		{"smtp.test.", dns.TypeA, dns.RcodeNameError, 0},       // its one port, 25, denied to its CNAME
		{`evil\.wild.test.`, dns.TypeA, dns.RcodeNameError, 0},
	} {
		m := ask(tc.name, tc.qtype)
		if m.Rcode != tc.rcode || len(m.Answer) != tc.answer {
			t.Errorf("%s %s: rcode %d, %d answers; want %d, %d:\n%v", tc.name, dns.TypeToString[tc.qtype], m.Rcode, len(m.Answer), tc.rcode, tc.answer, m)
		}
	}
	for _, name := range []string{"bad.wild.test.", "wild.test.", "other.test."} {
		if asked(name) != 0 {
			t.Errorf("%s, a name the policy refuses, was asked upstream", name)
		}
	}
	if r.refused["other.test"] != 1 || r.refused["private.test"] != 1 || r.refused["bad.wild.test"] != 1 {
		t.Errorf("refused names: %v", r.refused)
	}
	if r.refused["alias.wild.test"] != 1 || r.refused[`evil\.wild.test`] != 1 || r.refused["smtp.test"] != 1 {
		t.Errorf("refused names: %v", r.refused)
	}
	// allowed.test, a.wild.test, cdn.wild.test's edge, stray.wild.test,
	// www.wild.test and extra.wild.test (not its additional address) on
	// every port; ported.test on 443; allowed.test's port 25 closed, and
	// www.wild.test's 80 (its CNAME's).
	if got := setElements(t, c, TableName(id), setPin); got != 6 {
		t.Errorf("pin has %d elements, want 6", got)
	}
	if got := setElements(t, c, TableName(id), setPinPort); got != 1 {
		t.Errorf("pinport has %d elements, want 1", got)
	}
	if got := setElements(t, c, TableName(id), setDenyPort); got != 2 {
		t.Errorf("denyport has %d elements, want 2", got)
	}
	// Its answers hold what it pinned and the CNAMEs to it, nothing else.
	for _, name := range []string{"allowed.test.", "cdn.wild.test.", "extra.wild.test."} {
		m := ask(name, dns.TypeA)
		for _, rr := range slices.Concat(m.Answer, m.Ns, m.Extra) {
			if typ := rr.Header().Rrtype; typ != dns.TypeA && typ != dns.TypeCNAME && typ != dns.TypeOPT {
				t.Errorf("%s: the answer holds a %s record: %v", name, dns.TypeToString[typ], m)
			}
		}
	}
	// An answer is kept for its TTL: asked again, upstream is not.
	before := asked("allowed.test.")
	if m := ask("allowed.test.", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || asked("allowed.test.") != before {
		t.Errorf("asked again: rcode %d, %d answers, upstream asked %d more times", m.Rcode, len(m.Answer), asked("allowed.test.")-before)
	}
	// Odd queries are refused and counted, never asked upstream; another
	// type than A is answered empty, not asked either; the sandbox's EDNS
	// options never leave.
	odd := func(edit func(*dns.Msg)) *dns.Msg {
		q := new(dns.Msg).SetQuestion("a.wild.test.", dns.TypeA)
		edit(q)
		return r.answer(q)
	}
	for what, edit := range map[string]func(*dns.Msg){
		"two questions": func(q *dns.Msg) { q.Question = append(q.Question, q.Question[0]) },
		"class CH":      func(q *dns.Msg) { q.Question[0].Qclass = dns.ClassCHAOS },
		"an update":     func(q *dns.Msg) { q.Opcode = dns.OpcodeUpdate },
		"oversized": func(q *dns.Msg) {
			q.SetEdns0(4096, false)
			q.IsEdns0().Option = append(q.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: 65001, Data: make([]byte, 1000)})
		},
	} {
		if m := odd(edit); m.Rcode != dns.RcodeRefused {
			t.Errorf("%s: rcode %d, want REFUSED", what, m.Rcode)
		}
	}
	if r.refused["(odd query)"] != 3 || r.refused["(class CH)"] != 1 {
		t.Errorf("odd queries counted: %v", r.refused)
	}
	m := odd(func(q *dns.Msg) {
		q.SetEdns0(1232, false)
		q.IsEdns0().Option = append(q.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte("secret")})
		q.Question[0].Name = "edns.wild.test."
	})
	if m.Rcode != dns.RcodeNameError { // upstream does not know it: asked, without the option
		t.Errorf("with an EDNS option: rcode %d", m.Rcode)
	}
	for _, qtype := range []uint16{dns.TypeTXT, dns.TypeMX, dns.TypeANY} {
		if m := ask("txt.wild.test.", qtype); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
			t.Errorf("%s: rcode %d, %d answers; want none", dns.TypeToString[qtype], m.Rcode, len(m.Answer))
		}
	}
	if asked("txt.wild.test.") != 0 || asked("relayed") != 0 || asked("edns.wild.test.") != 1 {
		t.Errorf("upstream asked for txt.wild.test %d times, relayed %d, edns.wild.test %d", asked("txt.wild.test."), asked("relayed"), asked("edns.wild.test."))
	}
	// A resolver without a server to ask fails, and pins nothing.
	r.cfg.Upstream = nil
	if m := ask("fresh.wild.test.", dns.TypeA); m.Rcode != dns.RcodeServerFailure {
		t.Errorf("no upstream: rcode %d", m.Rcode)
	}
}

// fakeWriter is a dns.ResponseWriter that keeps the message written.
type fakeWriter struct {
	dns.ResponseWriter
	m *dns.Msg
}

func (w *fakeWriter) WriteMsg(m *dns.Msg) error { w.m = m; return nil }

// TestResolverQueuesABurst: 300 questions at once, more than the 64 it
// answers at a time, are all answered (they wait their turn), none
// SERVFAIL.
func TestResolverQueuesABurst(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		time.Sleep(20 * time.Millisecond) // a slow upstream: the questions pile up
		w.WriteMsg(new(dns.Msg).SetRcode(q, dns.RcodeNameError))
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	r := &resolver{cfg: ResolverConfig{Policy: Policy{Allow: rules("*.q.test")}, Upstream: []string{pc.LocalAddr().String()}},
		refused: map[string]int{}, busy: make(chan struct{}, maxQuestions)}
	var wg sync.WaitGroup
	rcodes := make([]int, 300)
	for i := range rcodes {
		wg.Go(func() {
			w := &fakeWriter{}
			r.ServeDNS(w, new(dns.Msg).SetQuestion(fmt.Sprintf("n%d.q.test.", i), dns.TypeA))
			rcodes[i] = w.m.Rcode
		})
	}
	wg.Wait()
	for i, rc := range rcodes {
		if rc != dns.RcodeNameError {
			t.Fatalf("question %d of 300: rcode %s, want NXDOMAIN (asked upstream)", i, dns.RcodeToString[rc])
		}
	}
}
