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
	"time"

	"github.com/miekg/dns"
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
	// Refused is the file, in the directory the DNS part is given, that
	// counts the names refused (RefusedNames).
	Refused string `json:"refused"`
	// Host are the host's addresses, which no answer may name (Start
	// fills them in).
	Host []netip.Addr `json:"host"`
}

// resolverTimeout bounds one question to the upstream servers.
const resolverTimeout = 5 * time.Second

// The resolver is two processes (see Serve): this file is its DNS part,
// which parses what the sandbox sends and what upstream answers, with no
// capability, under a seccomp filter (confineParser), and asks the other,
// privileged part to pin what it answers (pinRequest).

// parserFiles are the descriptors the DNS part is started with, after
// standard error: the directory it writes in, the executable (closed at
// once), its UDP and TCP listeners, and its end of the pin channel.
const (
	parserDir = 3 + iota
	parserExe
	parserUDP
	parserTCP
	parserPins
)

// parserFiles bounds the DNS part's descriptors (RLIMIT_NOFILE).
const parserFiles = 2048

// Answer is the resolver's DNS part: it confines itself, then answers the
// sandbox's DNS on the listeners it was given until ctx ends or the guard
// goes. It reads its configuration on stdin.
func Answer(ctx context.Context, stdin io.Reader) error {
	var cfg ResolverConfig
	if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&cfg); err != nil {
		return fmt.Errorf("read the configuration: %w", err)
	}
	unix.Close(parserExe)
	// Descriptors: its few own, and the sandbox's TCP connections, each
	// one (a sandbox cannot take the host's).
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: parserFiles, Max: parserFiles}); err != nil {
		return fmt.Errorf("bound its descriptors: %w", err)
	}
	if err := confineParser(); err != nil {
		return err
	}
	dir := os.NewFile(parserDir, "resolver directory")
	pc, err := net.FilePacketConn(os.NewFile(parserUDP, "udp listener"))
	if err != nil {
		return err
	}
	l, err := net.FileListener(os.NewFile(parserTCP, "tcp listener"))
	if err != nil {
		return err
	}
	pinConn, err := net.FileConn(os.NewFile(parserPins, "pins"))
	if err != nil {
		return err
	}
	pins := newPinClient(pinConn.(*net.UnixConn))
	r := &resolver{cfg: cfg, host: cfg.Host, dir: dir, refused: map[string]int{},
		busy: make(chan struct{}, maxQuestions), pinner: pins.pin}
	// A resolver started again (a resume) counts on from its predecessor.
	if names, err := readRefused(dir, cfg.Refused); err == nil {
		for _, n := range names {
			r.refused[n.Name] = n.Count
		}
	}
	servers := []*dns.Server{{PacketConn: pc, Handler: r}, {Listener: l, Handler: r}}
	errc := make(chan error, len(servers)+1)
	for _, s := range servers {
		go func() { errc <- s.ActivateAndServe() }()
	}
	go func() { errc <- pins.run() }()
	if err := pins.ready(); err != nil {
		return err
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, s := range servers {
				s.Shutdown()
			}
			return r.flush()
		case err := <-errc:
			r.flush()
			return fmt.Errorf("resolver: %w", err)
		case <-tick.C:
			if err := r.flush(); err != nil {
				return err
			}
		}
	}
}

type resolver struct {
	cfg    ResolverConfig
	host   []netip.Addr
	dir    *os.File // where cfg.Refused is
	busy   chan struct{}
	queued atomic.Int32 // questions waiting for busy
	pinner func(pinRequest) error

	mu      sync.Mutex // guards refused, dirty, answers
	refused map[string]int
	dirty   bool
	answers map[string]*cacheEntry // by name
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
	_, _, ok := r.cfg.Policy.NamePorts(name)
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
	_, _, ok = r.cfg.Policy.ChainPorts(name, chain)
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
		if len(pins) == maxPins {
			break // more than an answer needs, and a bound on what one pins
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
		if err := r.pinner(pinRequest{Name: name, Chain: chain, Addrs: pins, TTL: ttl}); err != nil {
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
