package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/egress"
	"github.com/flmbox/flmbox/sandbox/record"
)

// NetworkEgress gives the sandbox gVisor's own network stack on a link to
// the host, where a policy of the host's (Spec.Egress, which the sandbox
// cannot change) lets it reach what the policy allows and nothing else:
// not the host, its loopback, link-local addresses (the cloud's metadata
// service) or private ranges unless allowed by range. Names resolve
// through a resolver of the sandbox's own on the host, which answers only
// allowed names and opens the addresses it answered.
const NetworkEgress Network = "egress"

// Egress is where an egress sandbox may connect: Allow's names and ranges,
// but Deny's. Its DNS are the servers the sandbox's resolver asks
// (default: the host's, from /etc/resolv.conf).
type Egress struct {
	Allow []EgressRule `json:"allow,omitempty"`
	Deny  []EgressRule `json:"deny,omitempty"`
	DNS   []netip.Addr `json:"dns,omitempty"`
}

// EgressRule names destinations: HOST, *.DOMAIN, IP or CIDR, optionally
// with :PORT (ParseEgressRule; String and the JSON text say it back).
type EgressRule struct {
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

// ParseEgressRule parses an egress rule (errdefs.ErrInvalidArgument if it
// names none).
func ParseEgressRule(s string) (EgressRule, error) {
	r, err := egress.ParseRule(s)
	return EgressRule(r), err
}

func (r EgressRule) String() string                { return egress.Rule(r).String() }
func (r EgressRule) MarshalText() ([]byte, error)  { return egress.Rule(r).MarshalText() }
func (r *EgressRule) UnmarshalText(b []byte) error { return (*egress.Rule)(r).UnmarshalText(b) }

// policy is e as package egress takes it.
func (e Egress) policy() egress.Policy {
	p := egress.Policy{DNS: e.DNS}
	for _, r := range e.Allow {
		p.Allow = append(p.Allow, egress.Rule(r))
	}
	for _, r := range e.Deny {
		p.Deny = append(p.Deny, egress.Rule(r))
	}
	return p
}

// Narrow returns the policy that allows what both e (the most a caller may
// have) and n (what it asks for) allow: n's Allow, each of which must lie
// within one of e's (errdefs.ErrInvalidArgument naming the first that does
// not), or e's if n has none; and both Deny lists. DNS servers are e's.
func (e Egress) Narrow(n Egress) (Egress, error) {
	p, err := e.policy().Narrow(n.policy())
	return egressPolicy(p), err
}

// egressPolicy is p as package sandbox says it.
func egressPolicy(p egress.Policy) Egress {
	e := Egress{DNS: p.DNS}
	for _, r := range p.Allow {
		e.Allow = append(e.Allow, EgressRule(r))
	}
	for _, r := range p.Deny {
		e.Deny = append(e.Deny, EgressRule(r))
	}
	return e
}

// Refusal counts the packets an egress sandbox sent to one destination
// that its policy refused.
type Refusal struct {
	Destination netip.Addr `json:"destination"`
	// Port is 0 for a protocol without ports.
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
	Count    uint64 `json:"count"`
}

// RefusalClass counts the packets an egress sandbox's policy refused of
// one class (metadata, private, not allowed, ...): totals that never
// saturate.
type RefusalClass struct {
	Class string `json:"class"`
	Count uint64 `json:"count"`
}

// RefusedName counts the questions for one name that an egress sandbox's
// resolver refused (NXDOMAIN).
type RefusedName struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// EgressStatus is an egress sandbox's policy and what it refused.
type EgressStatus struct {
	Policy         Egress
	Refused        []Refusal
	RefusedNames   []RefusedName
	RefusedClasses []RefusalClass
}

// ResolverName is the file name of the egress sandboxes' resolver binary.
const ResolverName = egress.ResolverName

// WithResolver names the resolver binary (cmd/flmbox-resolver) that every
// egress sandbox runs on the host. Default: flmbox-resolver in the
// directory of the running executable.
func WithResolver(path string) Option { return func(o *options) { o.resolver = path } }

// Resolver returns the resolver binary of egress sandboxes, after checking
// that it is an executable file (errdefs.ErrNotFound otherwise).
func (m *Manager) Resolver() (string, error) {
	p := m.o.resolver
	if p == "" {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find %s: %w", ResolverName, err)
		}
		p = filepath.Join(filepath.Dir(self), ResolverName)
	}
	fi, err := os.Stat(p)
	if err == nil && (!fi.Mode().IsRegular() || fi.Mode()&0o111 == 0) {
		err = fmt.Errorf("not an executable file: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("find %s, egress sandboxes' resolver, at %s: %w", ResolverName, p, err)
	}
	return p, nil
}

// normalizeEgress checks an egress policy: rules only with NetworkEgress,
// IPv4 DNS servers.
func normalizeEgress(s Spec) error {
	e := s.Egress
	if s.Network != NetworkEgress && (len(e.Allow) > 0 || len(e.Deny) > 0 || len(e.DNS) > 0) {
		return fmt.Errorf("egress rules and DNS servers need network egress, not %s: %w", s.Network, errdefs.ErrInvalidArgument)
	}
	return e.policy().Validate()
}

func netnsPath(rec *record.Record) string { return filepath.Join(rec.Dir, "netns") }

func resolverFiles(rec *record.Record) egress.Resolver {
	return egress.Resolver{Config: filepath.Join(rec.Dir, "resolver.json"), Dir: filepath.Join(rec.Dir, "resolver"),
		Pid: filepath.Join(rec.Dir, "resolver.pid"), Log: filepath.Join(rec.Dir, "resolver.log"), Cgroup: rec.ID}
}

// refusedNames is the file the resolver counts refused names in, in its
// directory.
const refusedNames = "refused-names.json"

func refusedNamesPath(rec *record.Record) string {
	return filepath.Join(resolverFiles(rec).Dir, refusedNames)
}

// egressRecord is p as the record keeps it.
func egressRecord(p egress.Policy) *record.Egress {
	e := &record.Egress{}
	for _, r := range p.Allow {
		e.Allow = append(e.Allow, r.String())
	}
	for _, r := range p.Deny {
		e.Deny = append(e.Deny, r.String())
	}
	for _, a := range p.DNS {
		e.DNS = append(e.DNS, a.String())
	}
	return e
}

// egressOf is the policy and network the record of an egress sandbox keeps.
func egressOf(rec *record.Record) (egress.Policy, *egress.Network, error) {
	var p egress.Policy
	e := rec.Egress
	if e == nil {
		return p, nil, fmt.Errorf("sandbox %q has no egress policy: %w", rec.Name, errdefs.ErrDataLoss)
	}
	var errs []error
	parse := func(ss []string) (rules []egress.Rule) {
		for _, s := range ss {
			r, err := egress.ParseRule(s)
			errs = append(errs, err)
			rules = append(rules, r)
		}
		return rules
	}
	p.Allow, p.Deny = parse(e.Allow), parse(e.Deny)
	for _, s := range e.DNS {
		a, err := netip.ParseAddr(s)
		errs = append(errs, err)
		p.DNS = append(p.DNS, a)
	}
	n := &egress.Network{ID: rec.ID, NetNS: netnsPath(rec), Host: egress.HostLink(rec.ID), Counts: refusalCountsPath(rec)}
	var err1, err2 error
	n.Gateway, err1 = netip.ParseAddr(e.Gateway)
	n.Addr, err2 = netip.ParseAddr(e.Addr)
	if err := errors.Join(append(errs, err1, err2)...); err != nil {
		return p, nil, fmt.Errorf("sandbox %q's egress policy: %w", rec.Name, err)
	}
	return p, n, nil
}

// makeEgress makes the network of the new egress sandbox of rec (whose
// record is written, so that destroy finds whatever this leaves) and starts
// its resolver, which readies while runsc boots: wait returns once it
// listens (or why it does not). Its caller destroys the sandbox if either
// fails, after wait.
func (m *Manager) makeEgress(ctx context.Context, rec *record.Record, p egress.Policy) (wait func() error, err error) {
	bin, err := m.Resolver()
	if err != nil {
		return nil, fmt.Errorf("create sandbox %q: %w", rec.Name, err)
	}
	rec.Egress = egressRecord(p)
	if err := record.Write(rec); err != nil {
		return nil, err
	}
	n, err := egress.Create(ctx, rec.ID, netnsPath(rec), p)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %q: %w", rec.Name, err)
	}
	rec.Egress.Gateway, rec.Egress.Addr = n.Gateway.String(), n.Addr.String()
	if err := record.Write(rec); err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- m.startResolver(ctx, rec, bin, p, n) }()
	return sync.OnceValue(func() error { return <-errc }), nil
}

// startResolver starts the resolver of the egress sandbox of rec.
func (m *Manager) startResolver(ctx context.Context, rec *record.Record, bin string, p egress.Policy, n *egress.Network) error {
	up, err := upstreams(p.DNS)
	if err != nil && slices.ContainsFunc(p.Allow, func(r egress.Rule) bool { return r.Name != "" }) {
		return fmt.Errorf("sandbox %q: %w", rec.Name, err)
	} // without name rules the resolver asks no one: every name is refused
	cfg := egress.ResolverConfig{Table: egress.TableName(rec.ID), Link: n.Host, Gateway: n.Gateway, Policy: p, Upstream: up,
		Refused: refusedNames}
	if err := resolverFiles(rec).Start(ctx, bin, cfg); err != nil {
		return fmt.Errorf("sandbox %q: %w", rec.Name, err)
	}
	return nil
}

// resumeEgress readies the network of the suspended egress sandbox of rec
// for its restore: whatever of it is gone made again (after a reboot: its
// namespace, link and table, with its addresses if they are free), the
// addresses runsc took from its link, and its resolver.
func (m *Manager) resumeEgress(ctx context.Context, rec *record.Record) error {
	bin, err := m.Resolver()
	if err != nil {
		return err
	}
	p, n, err := egressOf(rec)
	if err != nil {
		return err
	}
	if _, err := n.Ensure(ctx, p); errors.Is(err, egress.ErrGone) {
		if err := m.recreateEgress(ctx, rec, p, n); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("sandbox %q's network: %w", rec.Name, err)
	}
	if err := n.Configure(); err != nil {
		return fmt.Errorf("sandbox %q's network: %w", rec.Name, err)
	}
	if err := resolverFiles(rec).Stop(); err != nil {
		return err
	}
	return m.startResolver(ctx, rec, bin, p, n)
}

// recreateEgress makes the network of the egress sandbox of rec again
// from nothing; if its addresses changed, its record and /etc/resolv.conf
// say the new ones.
func (m *Manager) recreateEgress(ctx context.Context, rec *record.Record, p egress.Policy, n *egress.Network) error {
	if err := n.Recreate(ctx, p); err != nil {
		return fmt.Errorf("sandbox %q's network, made again: %w", rec.Name, err)
	}
	if gw := n.Gateway.String(); gw != rec.Egress.Gateway {
		rec.Egress.Gateway, rec.Egress.Addr = gw, n.Addr.String()
		if err := record.Write(rec); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(etcDir(rec), filepath.Base(etcResolv)), []byte("nameserver "+gw+"\n"), 0o644); err != nil {
			return fmt.Errorf("sandbox %q's /etc/resolv.conf: %w", rec.Name, err)
		}
	}
	return nil
}

// healEgress repairs the network of the running egress sandbox of rec:
// its table if it went (the host's rules flushed), its link if its
// resolver took it down then, its resolver if it is not running. Each
// repair is a warning.
func (m *Manager) healEgress(ctx context.Context, rec *record.Record) error {
	p, n, err := egressOf(rec)
	if err != nil {
		return err
	}
	repaired, err := n.Ensure(ctx, p)
	for _, r := range repaired {
		m.o.warnf("sandbox %s: made %s again", rec.Name, r)
	}
	if err != nil {
		return fmt.Errorf("sandbox %q's network: %w", rec.Name, err)
	}
	if resolverFiles(rec).Running() {
		return nil
	}
	bin, err := m.Resolver()
	if err != nil {
		return err
	}
	m.o.warnf("sandbox %s: its resolver was not running: started again", rec.Name)
	if err := resolverFiles(rec).Stop(); err != nil {
		return err
	}
	return m.startResolver(ctx, rec, bin, p, n)
}

// removeEgress removes the network and resolver of the egress sandbox of
// rec, whatever of them is there.
func removeEgress(rec *record.Record) error {
	return errors.Join(resolverFiles(rec).Stop(), egress.Delete(rec.ID, netnsPath(rec)))
}

// hostResolvers are the IPv4 servers of the host's resolv.conf.
func hostResolvers() []netip.Addr {
	f, err := os.Open(hostResolvConf)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "nameserver" {
			if a, err := netip.ParseAddr(fs[1]); err == nil && a.Is4() {
				out = append(out, a)
			}
		}
	}
	return out
}

// upstreams are the servers a resolver asks: dns, or the host's.
func upstreams(dns []netip.Addr) ([]string, error) {
	if len(dns) == 0 {
		dns = hostResolvers()
	}
	if len(dns) == 0 {
		return nil, fmt.Errorf("no DNS server to ask: the host's %s names no IPv4 server, and none was given: %w", hostResolvConf, errdefs.ErrFailedPrecondition)
	}
	var out []string
	for _, a := range dns {
		out = append(out, netip.AddrPortFrom(a, 53).String())
	}
	return out, nil
}

// refusalCountsPath is the file that keeps the refusal counts of the
// egress sandbox of rec's earlier tables (egress.Network.Counts).
func refusalCountsPath(rec *record.Record) string {
	return filepath.Join(rec.Dir, "refusal-counts.json")
}

// egressStatus is what the egress sandbox of rec refused.
func egressStatus(rec *record.Record) *EgressStatus {
	p, _, err := egressOf(rec)
	if err != nil {
		return nil
	}
	st := &EgressStatus{Policy: egressPolicy(p)}
	refused, _ := egress.Refusals(rec.ID)
	for _, r := range refused {
		st.Refused = append(st.Refused, Refusal(r))
	}
	classes, _ := egress.RefusalClasses(rec.ID, refusalCountsPath(rec))
	for _, c := range classes {
		st.RefusedClasses = append(st.RefusedClasses, RefusalClass(c))
	}
	names, _ := egress.RefusedNames(refusedNamesPath(rec))
	for _, n := range names {
		st.RefusedNames = append(st.RefusedNames, RefusedName(n))
	}
	return st
}

// reconcileEgress deletes the egress tables no sandbox has any more (see
// egress.Prune).
func (m *Manager) reconcileEgress(ctx context.Context) error {
	if err := egress.Prune(ctx); err != nil {
		return fmt.Errorf("reconcile egress networks: %w", err)
	}
	return nil
}
