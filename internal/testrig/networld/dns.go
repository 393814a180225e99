package networld

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/miekg/dns"
)

// dnsServer is authoritative for the names it holds and answers NXDOMAIN
// for every other.
type dnsServer struct {
	hits *hitCounter

	mu      sync.Mutex
	a, aaaa map[string][]netip.Addr // by canonical name
	cname   map[string]string       // canonical name → its CNAME's target
	extra   map[string][]netip.Addr // A records of a name, sent in the additional section of its answers
	queries map[string]int
	odd     int // queries of another class than IN, with EDNS options, or over 512 bytes
}

// defaultNames are the world's names and their addresses.
var defaultNames = map[string][]string{
	"allowed.test":  {AllowedAddr},
	"other.test":    {OtherAddr},
	"pypi.test":     {PyPIAddr},
	"private.test":  {PrivateAddr},
	"meta.test":     {MetadataAddr},
	"sub.wild.test": {AllowedAddr},
	"v6.test":       {WorldAddr6},
}

func newDNSServer(hits *hitCounter) *dnsServer {
	d := &dnsServer{hits: hits, a: map[string][]netip.Addr{}, aaaa: map[string][]netip.Addr{}, cname: map[string]string{},
		extra: map[string][]netip.Addr{}, queries: map[string]int{}}
	for name, addrs := range defaultNames {
		for _, s := range addrs {
			a := netip.MustParseAddr(s)
			if a.Is4() {
				d.a[canonical(name)] = append(d.a[canonical(name)], a)
			} else {
				d.aaaa[canonical(name)] = append(d.aaaa[canonical(name)], a)
			}
		}
	}
	return d
}

// canonical is name lowercased without its final dot.
func canonical(name string) string { return strings.TrimSuffix(strings.ToLower(name), ".") }

// SetA makes name's A records ips (IPv4 addresses), replacing its others;
// no ips leaves name known, with no A record. It panics on an address that
// is not IPv4: a test's own mistake.
func (w *World) SetA(name string, ips ...string) { w.dns.set(w.dns.a, name, ips, true) }

// SetAAAA makes name's AAAA records ips (IPv6 addresses), as SetA does.
func (w *World) SetAAAA(name string, ips ...string) { w.dns.set(w.dns.aaaa, name, ips, false) }

func (d *dnsServer) set(m map[string][]netip.Addr, name string, ips []string, v4 bool) {
	addrs := []netip.Addr{} // not nil: a name set to nothing is known
	for _, s := range ips {
		a := netip.MustParseAddr(s)
		if a.Is4() != v4 {
			panic(fmt.Sprintf("networld: %s is not an address of the record's family", s))
		}
		addrs = append(addrs, a)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m[canonical(name)] = addrs
}

// SetCNAME makes name a CNAME of target: its answers are the CNAME and
// target's records of the type asked.
func (w *World) SetCNAME(name, target string) {
	w.dns.mu.Lock()
	defer w.dns.mu.Unlock()
	w.dns.cname[canonical(name)] = canonical(target)
}

// SetExtraA adds to each answer for name A records of name, with ips, in
// the additional section (where an answer's addresses do not belong).
func (w *World) SetExtraA(name string, ips ...string) {
	var addrs []netip.Addr
	for _, s := range ips {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	w.dns.mu.Lock()
	defer w.dns.mu.Unlock()
	w.dns.extra[canonical(name)] = addrs
}

// OddQueries returns how many queries the DNS server had that a resolver
// of flmbox's would never ask: of another class than IN, with EDNS
// options, or over 512 bytes (a sandbox's, relayed).
func (w *World) OddQueries() int {
	w.dns.mu.Lock()
	defer w.dns.mu.Unlock()
	return w.dns.odd
}

// Queries returns how many queries (of any type, UDP or TCP) the DNS
// server had for name.
func (w *World) Queries(name string) int {
	w.dns.mu.Lock()
	defer w.dns.mu.Unlock()
	return w.dns.queries[canonical(name)]
}

// ServeDNS answers a query: records of the name and type asked, an empty
// answer for a known name without them, NXDOMAIN for an unknown name.
func (d *dnsServer) ServeDNS(rw dns.ResponseWriter, q *dns.Msg) {
	d.hits.add(DNS, addrPort(rw.LocalAddr()), addrPort(rw.RemoteAddr()))
	odd := q.Len() > 512
	if opt := q.IsEdns0(); opt != nil && len(opt.Option) > 0 {
		odd = true
	}
	for _, question := range q.Question {
		odd = odd || question.Qclass != dns.ClassINET
	}
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	d.mu.Lock()
	if odd {
		d.odd++
	}
	for _, question := range q.Question {
		name := canonical(question.Name)
		d.queries[name]++
		for _, ip := range d.extra[name] {
			hdr := dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}
			m.Extra = append(m.Extra, &dns.A{Hdr: hdr, A: net.IP(ip.AsSlice())})
		}
		owner := question.Name
		if target, ok := d.cname[name]; ok {
			m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 5},
				Target: dns.Fqdn(target)})
			name, owner = target, dns.Fqdn(target)
		}
		a, hasA := d.a[name]
		aaaa, hasAAAA := d.aaaa[name]
		if !hasA && !hasAAAA {
			m.Rcode = dns.RcodeNameError
			continue
		}
		hdr := dns.RR_Header{Name: owner, Class: dns.ClassINET, Ttl: 5}
		switch question.Qtype {
		case dns.TypeA:
			hdr.Rrtype = dns.TypeA
			for _, ip := range a {
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IP(ip.AsSlice())})
			}
		case dns.TypeAAAA:
			hdr.Rrtype = dns.TypeAAAA
			for _, ip := range aaaa {
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.IP(ip.AsSlice())})
			}
		}
	}
	d.mu.Unlock()
	rw.WriteMsg(m)
}

// serveDNS starts the DNS server on DNSAddr:53, UDP and TCP, in world.
func (w *World) serveDNS() error {
	addr := net.JoinHostPort(DNSAddr, "53")
	var pc net.PacketConn
	var ln net.Listener
	err := inNetNS(w.world, func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", addr); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		if pc != nil {
			pc.Close()
		}
		return fmt.Errorf("listen for DNS on %s: %w", addr, err)
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: w.dns}, {Listener: ln, Handler: w.dns}} {
		go srv.ActivateAndServe()
		w.onClose(func() error {
			// Shutdown fails on a server that has not started yet:
			// close its socket, which stops it either way.
			srv.Shutdown()
			if srv.PacketConn != nil {
				srv.PacketConn.Close()
			} else {
				srv.Listener.Close()
			}
			return nil
		})
	}
	return nil
}
