package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ResolverConfig is what a sandbox's resolver serves: Serve answers the
// sandbox's DNS on Gateway:53 (UDP and TCP) from Policy.DNS's servers.
type ResolverConfig struct {
	// Table is the sandbox's nftables table, where answers are pinned.
	Table string `json:"table"`
	// Link is the host's end of the sandbox's link, which the resolver
	// takes down if the table goes (see Serve).
	Link string `json:"link"`
	// Gateway is the address the resolver listens on.
	Gateway netip.Addr `json:"gateway"`
	// Policy says which names resolve and to what.
	Policy Policy `json:"policy"`
	// Upstream are the servers asked, each host:port.
	Upstream []string `json:"upstream"`
	// Refused is the file, in the directory Serve is given, that counts
	// the names refused (RefusedNames).
	Refused string `json:"refused"`
}

// resolverTimeout bounds one question to the upstream servers.
const resolverTimeout = 5 * time.Second

// Serve answers DNS for one sandbox until ctx ends: a name the policy does
// not allow is NXDOMAIN; an allowed name is asked upstream, its IPv4
// answers the policy refuses (reserved, the host's own, denied) are
// dropped, the rest pinned in the sandbox's table for the ports the policy
// gives the name before the answer is sent, and AAAA answers dropped (a
// sandbox has no IPv6). It writes only in dir (cfg.Refused). Every 2 s it
// checks that the sandbox's table is there; if not, it takes the
// sandbox's link down and returns: without its table, the link would
// reach whatever the host routes to. ready is
// called once both sockets listen.
func Serve(ctx context.Context, cfg ResolverConfig, dir *os.File, ready func()) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	r := &resolver{cfg: cfg, nft: c, refused: map[string]int{}, host: hostAddrs(), dir: dir, busy: make(chan struct{}, maxQuestions)}
	// A resolver started again (a resume) counts on from its predecessor.
	if names, err := readRefused(dir, cfg.Refused); err == nil {
		for _, n := range names {
			r.refused[n.Name] = n.Count
		}
	}
	addr := netip.AddrPortFrom(cfg.Gateway, 53).String()
	lc := net.ListenConfig{Control: markSocket}
	pc, err := lc.ListenPacket(ctx, "udp4", addr)
	if err != nil {
		return fmt.Errorf("resolver: %w", err)
	}
	l, err := lc.Listen(ctx, "tcp4", addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("resolver: %w", err)
	}
	servers := []*dns.Server{{PacketConn: pc, Handler: r}, {Listener: l, Handler: r}}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- s.ActivateAndServe() }()
	}
	// The table is the whole policy: if it loses a rule, a chain or
	// itself (a flush of the host's rules, a reload, the sandbox's
	// removal), the link goes down at once, and the resolver leaves.
	// nftables tells of every deletion (watchTable); should its messages be
	// lost, the resolver compares the table with its policy every second.
	changed, stopWatch := r.watchTable(ctx)
	defer stopWatch()
	if err := r.checkTable(); err != nil {
		return r.failClosed(err)
	}
	if ready != nil {
		ready()
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			for _, s := range servers {
				s.Shutdown()
			}
			return r.flush()
		case err := <-errc:
			return fmt.Errorf("resolver: %w", err)
		case err := <-changed:
			if err == nil {
				err = r.checkTable() // the watch ended: whole so far?
			}
			if err != nil {
				return r.failClosed(err)
			}
			changed = nil // polled from now on
		case <-tick.C:
			if err := r.flush(); err != nil {
				return err
			}
			if changed == nil && i%5 == 4 {
				if err := r.checkTable(); err != nil {
					return r.failClosed(err)
				}
			}
		}
	}
}

// watchTable watches nftables' deletions: changed gets an error wrapping
// errTableChanged once one touches the sandbox's table, or nil if the
// watch ends (its messages were lost: the caller polls then).
func (r *resolver) watchTable(ctx context.Context) (changed <-chan error, stop func()) {
	ch := make(chan error, 1)
	// Every event: google/nftables hands a transaction's events over on
	// its closing generation message, which only MonitorObjectAny lets
	// through (the kernel sends every subscriber every event anyway).
	mon := nftables.NewMonitor()
	c, err := nftables.New()
	if err == nil {
		var events chan *nftables.MonitorEvent
		if events, err = c.AddMonitor(mon); err == nil {
			go func() {
				for ev := range events {
					if what := r.ours(ev); what != "" {
						ch <- fmt.Errorf("table %s: %s deleted: %w", r.cfg.Table, what, errTableChanged)
						break
					}
					if ev.Type == nftables.MonitorEventTypeOOB {
						break
					}
				}
				select {
				case ch <- nil:
				default:
				}
				mon.Close()
				for range events { // until the monitor's goroutine ends
				}
			}()
			return ch, func() { mon.Close() }
		}
	}
	ch <- nil // no watch: poll
	return ch, func() {}
}

// ours says what ev deleted of the sandbox's table, "" if nothing.
func (r *resolver) ours(ev *nftables.MonitorEvent) string {
	switch d := ev.Data.(type) {
	case *nftables.Table:
		if ev.Type == nftables.MonitorEventTypeDelTable && d.Name == r.cfg.Table {
			return "the table"
		}
	case *nftables.Chain:
		if ev.Type == nftables.MonitorEventTypeDelChain && d.Table != nil && d.Table.Name == r.cfg.Table {
			return "chain " + d.Name
		}
	case *nftables.Rule:
		if ev.Type == nftables.MonitorEventTypeDelRule && d.Table != nil && d.Table.Name == r.cfg.Table {
			return "a rule of chain " + chainName(d.Chain)
		}
	}
	return ""
}

func chainName(c *nftables.Chain) string {
	if c == nil {
		return "?"
	}
	return c.Name
}

// checkTable compares the sandbox's table with its policy (see
// Network.checkTable); nil if it is whole or cannot be read.
func (r *resolver) checkTable() error {
	n := &Network{ID: r.cfg.Table, Host: r.cfg.Link, Gateway: r.cfg.Gateway, Addr: r.cfg.Gateway.Next()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.tableExistsLocked() {
		return fmt.Errorf("table %s is gone: %w", r.cfg.Table, errTableChanged)
	}
	if err := n.checkTable(r.nft, r.cfg.Policy); errors.Is(err, errTableChanged) {
		return err
	}
	return nil
}

// markSocket marks a resolver's socket with ResolverMark, which the
// sandbox's table lets DNS reach (CAP_NET_ADMIN).
func markSocket(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, ResolverMark)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("mark the resolver's socket: %w", serr)
	}
	return nil
}

type resolver struct {
	cfg    ResolverConfig
	host   []netip.Addr
	dir    *os.File // where cfg.Refused is
	busy   chan struct{}
	queued atomic.Int32 // questions waiting for busy

	mu      sync.Mutex // guards nft (one batch at a time), refused, dirty, answers
	nft     *nftables.Conn
	refused map[string]int
	dirty   bool
	answers map[string]*cacheEntry // by name
}

// failClosed takes the sandbox's link down (it may be gone: the sandbox
// was removed) and says why the resolver ends: why, the table's change.
func (r *resolver) failClosed(why error) error {
	l, err := netlink.LinkByName(r.cfg.Link)
	if err != nil {
		return fmt.Errorf("resolver: %w, and link %s: %w", why, r.cfg.Link, err)
	}
	if err := netlink.LinkSetDown(l); err != nil {
		return fmt.Errorf("resolver: %w: take link %s down: %w", why, r.cfg.Link, err)
	}
	return fmt.Errorf("resolver: %w: link %s taken down", why, r.cfg.Link)
}

// tableExistsLocked reports whether the sandbox's table is there (true if
// that cannot be told). The caller holds r.mu.
func (r *resolver) tableExistsLocked() bool {
	t, err := inetTable(r.nft, r.cfg.Table)
	return err != nil || t != nil
}

// hostAddrs are the host's own addresses, which no answer may name.
func hostAddrs() []netip.Addr {
	addrs, _ := netlink.AddrList(nil, netlink.FAMILY_V4)
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			out = append(out, ip)
		}
	}
	return out
}

// maxQuestions bounds the questions a resolver answers at once; up to
// maxQueued more wait their turn, each at most queueWait, and the rest are
// answered SERVFAIL at once: a sandbox cannot grow its resolver, and a burst
// of questions (300 at once answered 64, SERVFAIL 204 when none waited) is
// answered.
const (
	maxQuestions = 64
	maxQueued    = 1024
	queueWait    = 2 * time.Second
)

func (r *resolver) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	select {
	case r.busy <- struct{}{}:
	default:
		if r.queued.Add(1) > maxQueued {
			r.queued.Add(-1)
			w.WriteMsg(new(dns.Msg).SetRcode(q, dns.RcodeServerFailure))
			return
		}
		t := time.NewTimer(queueWait)
		select {
		case r.busy <- struct{}{}:
			t.Stop()
			r.queued.Add(-1)
		case <-t.C:
			r.queued.Add(-1)
			w.WriteMsg(new(dns.Msg).SetRcode(q, dns.RcodeServerFailure))
			return
		}
	}
	defer func() { <-r.busy }()
	w.WriteMsg(r.answer(q))
}

// maxQuery is the largest query a resolver takes, in bytes: one question
// of a name of at most 255 bytes, its header and an EDNS record with room to
// spare. A larger one (the issue saw 60,045 bytes over TCP) carries
// something else.
const maxQuery = 512

// answer answers q, a sandbox's query. The resolver never relays it: it asks
// upstream a query of its own (the name, A, class IN, recursion, its own
// EDNS size, no option of the sandbox's), and builds the answer itself from
// what upstream answered: the CNAMEs from the asked name and the A records
// of their chain it pinned, nothing else (no authority, no additional
// records, no TXT). Odd queries (not one question of class IN, not a plain
// query, too large) are refused and counted; a type but A is answered with
// no record (AAAA: a sandbox has no IPv6) without asking upstream.
func (r *resolver) answer(q *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	if len(q.Question) != 1 || q.Opcode != dns.OpcodeQuery || q.Len() > maxQuery || len(q.Answer)+len(q.Ns) > 0 {
		r.refuse("(odd query)")
		return m.SetRcode(q, dns.RcodeRefused)
	}
	question := q.Question[0]
	if question.Qclass != dns.ClassINET {
		r.refuse("(class " + dns.ClassToString[question.Qclass] + ")")
		return m.SetRcode(q, dns.RcodeRefused)
	}
	name := strings.TrimSuffix(strings.ToLower(question.Name), ".")
	ports, denied, ok := r.cfg.Policy.NamePorts(name)
	if !ok || !validName(name) { // a name with escapes (\.) is matched by no rule
		r.refuse(name)
		return m.SetRcode(q, dns.RcodeNameError)
	}
	m.SetReply(q)
	m.RecursionAvailable = true
	if q.IsEdns0() != nil {
		m.SetEdns0(ednsSize, false)
	}
	if question.Qtype != dns.TypeA {
		return m // no record of that type: only A records open anything
	}
	if c, ok := r.cached(name); ok {
		m.Rcode, m.Answer = c.rcode, c.records(time.Now())
		return m
	}
	up, err := r.ask(name)
	if err != nil || up.Rcode != dns.RcodeSuccess && up.Rcode != dns.RcodeNameError {
		return m.SetRcode(q, dns.RcodeServerFailure)
	}
	// The names the answer goes through (CNAMEs from the question's), in
	// order, and the records that say so.
	chain, cnames := []string{name}, []dns.RR{}
	for cur, i := name, 0; i < len(up.Answer); i++ {
		for _, rr := range up.Answer {
			if c, ok := rr.(*dns.CNAME); ok && strings.TrimSuffix(strings.ToLower(c.Hdr.Name), ".") == cur && !slices.Contains(chain, strings.TrimSuffix(strings.ToLower(c.Target), ".")) {
				cur = strings.TrimSuffix(strings.ToLower(c.Target), ".")
				chain = append(chain, cur)
				cnames = append(cnames, &dns.CNAME{Hdr: dns.RR_Header{Name: c.Hdr.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: c.Hdr.Ttl}, Target: c.Target})
				break
			}
		}
	}
	// Each name of the chain is checked against the Deny rules, with
	// their ports: a port denied to a name the answer goes through is
	// closed for the answer's addresses too.
	ports, denied, ok = r.cfg.Policy.ChainPorts(name, chain)
	if !ok {
		r.refuse(name)
		return m.SetRcode(q, dns.RcodeNameError)
	}
	// Only the answer section's A records of the chain's names are
	// pinned and sent.
	var pins []netip.Addr
	var addrs []dns.RR
	ttl, dropped := uint32(0), 0
	for _, rr := range up.Answer {
		a, ok := rr.(*dns.A)
		if !ok || !slices.Contains(chain, strings.TrimSuffix(strings.ToLower(a.Hdr.Name), ".")) {
			continue // another name's address, or another type
		}
		ip, ok := netip.AddrFromSlice(a.A.To4())
		if !ok || !r.cfg.Policy.AnswerAllowed(ip, r.host) {
			dropped++
			continue
		}
		pins = append(pins, ip)
		addrs = append(addrs, &dns.A{Hdr: dns.RR_Header{Name: a.Hdr.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: a.Hdr.Ttl}, A: a.A})
		ttl = max(ttl, a.Hdr.Ttl)
	}
	if len(pins) == 0 && dropped > 0 {
		// Every address the name has is refused: the name is, as if it
		// were not allowed.
		r.refuse(name)
		return m.SetRcode(q, dns.RcodeNameError)
	}
	if len(pins) > 0 {
		r.mu.Lock()
		err := pin(r.nft, r.cfg.Table, pins, ports, denied, time.Duration(ttl)*time.Second)
		r.mu.Unlock()
		if err != nil {
			return m.SetRcode(q, dns.RcodeServerFailure) // fail closed
		}
	}
	c := r.cache(name, up.Rcode, append(cnames, addrs...))
	m.Rcode, m.Answer = c.rcode, c.records(time.Now())
	return m
}

// ednsSize is the UDP payload size the resolver offers, upstream and to
// the sandbox: DNS flag day 2020's.
const ednsSize = 1232

// Answers are kept for their TTL, at most cacheMax (the pins of an answer
// last minPin at least, so an answer kept no longer finds its addresses
// still pinned) and at least cacheMin; an NXDOMAIN cacheNegative; at most
// cacheSize names (expired ones go first, then any).
const (
	cacheMax      = minPin / 2
	cacheMin      = 5 * time.Second
	cacheNegative = 30 * time.Second
	cacheSize     = 1024
)

// cacheEntry is an answer kept: its records, with TTLs counted down from
// when it was asked.
type cacheEntry struct {
	rcode   int
	rrs     []dns.RR
	asked   time.Time
	expires time.Time
}

// records are e's records with their TTLs as of now.
func (e *cacheEntry) records(now time.Time) []dns.RR {
	age := uint32(now.Sub(e.asked) / time.Second)
	out := make([]dns.RR, len(e.rrs))
	for i, rr := range e.rrs {
		rr = dns.Copy(rr)
		h := rr.Header()
		h.Ttl = min(max(h.Ttl, age)-age, uint32(e.expires.Sub(now)/time.Second)+1)
		out[i] = rr
	}
	return out
}

// cached returns name's answer if it is kept and current.
func (r *resolver) cached(name string) (*cacheEntry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.answers[name]
	if !ok || time.Now().After(e.expires) {
		return nil, false
	}
	return e, true
}

// cache keeps name's answer.
func (r *resolver) cache(name string, rcode int, rrs []dns.RR) *cacheEntry {
	now := time.Now()
	life := cacheNegative
	if rcode == dns.RcodeSuccess {
		ttl := uint32(cacheMax / time.Second)
		for _, rr := range rrs {
			ttl = min(ttl, rr.Header().Ttl)
		}
		life = max(time.Duration(ttl)*time.Second, cacheMin)
	}
	e := &cacheEntry{rcode: rcode, rrs: rrs, asked: now, expires: now.Add(life)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answers == nil {
		r.answers = map[string]*cacheEntry{}
	}
	if _, ok := r.answers[name]; !ok && len(r.answers) >= cacheSize {
		for n, old := range r.answers {
			if now.After(old.expires) {
				delete(r.answers, n)
			}
		}
		for n := range r.answers {
			if len(r.answers) < cacheSize {
				break
			}
			delete(r.answers, n)
		}
	}
	r.answers[name] = e
	return e
}

// ask asks the upstream servers in turn for name's A records, over TCP when
// UDP's answer is truncated: a query of the resolver's own.
func (r *resolver) ask(name string) (*dns.Msg, error) {
	q := new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA)
	q.SetEdns0(ednsSize, false)
	errs := []error{errors.New("no DNS server to ask")}
	for _, s := range r.cfg.Upstream {
		c := &dns.Client{Net: "udp", Timeout: resolverTimeout}
		m, _, err := c.Exchange(q, s)
		if err == nil && m.Truncated {
			c.Net = "tcp"
			m, _, err = c.Exchange(q, s)
		}
		if err == nil {
			return m, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (r *resolver) refuse(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.refused[name]; ok || len(r.refused) < refusedSize {
		r.refused[name]++
		r.dirty = true
	}
}

// flush writes the names refused, if any changed.
func (r *resolver) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.dirty || r.cfg.Refused == "" || r.dir == nil {
		return nil
	}
	var names []RefusedName
	for n, c := range r.refused {
		names = append(names, RefusedName{Name: n, Count: c})
	}
	slices.SortFunc(names, func(a, b RefusedName) int { return strings.Compare(a.Name, b.Name) })
	b, err := json.Marshal(names)
	if err != nil {
		return err
	}
	if err := writeAt(r.dir, r.cfg.Refused, b); err != nil {
		return fmt.Errorf("write the names refused: %w", err)
	}
	r.dirty = false
	return nil
}

// writeAt replaces the file name in dir with data: a temporary file, then a
// rename, both relative to dir (the resolver cannot reach dir by its path).
func writeAt(dir *os.File, name string, data []byte) error {
	fd := int(dir.Fd())
	tmp := "." + name + ".tmp"
	f, err := unix.Openat(fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = unix.Write(f, data)
	if cerr := unix.Close(f); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return unix.Renameat(fd, tmp, fd, name)
}

// RefusedName counts the questions for a name the policy does not allow.
type RefusedName struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// RefusedNames reads the names a resolver refused from its file at path
// (none if there is none). The file is in a directory the resolver owns: a
// link, or anything but a regular file of at most maxRefusedFile bytes, is
// refused.
func RefusedNames(path string) ([]RefusedName, error) {
	dir, err := os.Open(filepath.Dir(path))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return readRefused(dir, filepath.Base(path))
}

// maxRefusedFile bounds a file of refused names: refusedSize names.
const maxRefusedFile = refusedSize * 300

// readRefused reads the refused names of file name in dir.
func readRefused(dir *os.File, name string) ([]RefusedName, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the refused names: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxRefusedFile {
		return nil, fmt.Errorf("read the refused names: %s is not a regular file of at most %d bytes", name, maxRefusedFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRefusedFile))
	if err != nil {
		return nil, err
	}
	var names []RefusedName
	return names, json.Unmarshal(b, &names)
}
