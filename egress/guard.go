package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A sandbox's resolver is two processes, both started by Resolver.Start
// as ResolverUser. The guard (Serve) lives in the router's namespace with
// CAP_NET_ADMIN and nothing else: it watches the sandbox's table and takes
// the link down if the table changes, and adds to the table's sets the
// addresses the other part asks it to pin, after checking them against the
// policy itself. The DNS part (Answer) lives in the host's namespace (it
// asks the host's DNS servers, 127.0.0.53 too) with no capability, no way
// to gain one and a seccomp filter, and parses DNS: what code in the
// sandbox sends, on two sockets Start made in the router, and what upstream
// answers.

// DNSPartName is the name (comm) of a resolver's DNS part.
const DNSPartName = "flmbox-dns"

// DNSPartArg is the last argument of a resolver's DNS part's command line.
const DNSPartArg = "dns"

// guardFiles bounds the guard's descriptors (RLIMIT_NOFILE): a few
// sockets and files of its own.
const guardFiles = 64

// maxPins bounds the addresses one answer pins (and gives).
const maxPins = 64

// pinRequest asks the privileged part to pin Addrs, the answer for Name
// through Chain (Name, then the CNAMEs' targets), for TTL seconds. ID 0
// is the DNS part's word that it is ready.
type pinRequest struct {
	ID    uint64       `json:"id"`
	Name  string       `json:"name"`
	Chain []string     `json:"chain"`
	Addrs []netip.Addr `json:"addrs"`
	TTL   uint32       `json:"ttl"`
}

// pinReply answers the pinRequest of the same ID; Error is empty if the
// addresses are pinned.
type pinReply struct {
	ID    uint64 `json:"id"`
	Error string `json:"error,omitempty"`
}

// maxPinMessage bounds a message between the parts.
const maxPinMessage = 16 << 10

// Serve is a sandbox's resolver's guard, in the router's namespace: it
// keeps CAP_NET_ADMIN only, pins what the DNS part asks on pins, and
// watches the sandbox's table. The table is the whole policy: if it loses a
// rule, a chain or itself, or the DNS part ends, the link goes down at once
// and Serve returns. nftables tells of every deletion (watchTable); should
// its messages be lost, Serve compares the table with its policy every
// second. ready is called once the DNS part answers.
func Serve(ctx context.Context, cfg ResolverConfig, pins *os.File, ready func()) error {
	if err := keepOnlyNetAdmin(); err != nil {
		return fmt.Errorf("resolver: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: guardFiles, Max: guardFiles}); err != nil {
		return fmt.Errorf("resolver: bound its descriptors: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	g := &guard{cfg: cfg, nft: c, host: cfg.Host}
	pinConn, err := net.FileConn(pins)
	pins.Close()
	if err != nil {
		return err
	}
	defer pinConn.Close()
	readyc, pinsDone := make(chan struct{}), make(chan error, 1)
	go func() { pinsDone <- g.servePins(pinConn.(*net.UnixConn), readyc) }()
	changed, stopWatch := g.watchTable(ctx)
	defer stopWatch()
	if err := g.checkTable(); err != nil {
		return g.failClosed(err)
	}
	start := time.NewTimer(resolverStart)
	defer start.Stop()
	select {
	case <-readyc:
	case err := <-pinsDone:
		return fmt.Errorf("resolver: its DNS part ended: %v", err)
	case <-start.C:
		return fmt.Errorf("resolver: its DNS part is not ready after %v", resolverStart)
	case <-ctx.Done():
		return nil
	}
	if ready != nil {
		ready()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-pinsDone:
			return g.failClosed(fmt.Errorf("its DNS part ended: %v", err))
		case err := <-changed:
			if err == nil {
				err = g.checkTable() // the watch ended: whole so far?
			}
			if err != nil {
				return g.failClosed(err)
			}
			changed = nil // polled from now on
		case <-tick.C:
			if changed == nil {
				if err := g.checkTable(); err != nil {
					return g.failClosed(err)
				}
			}
		}
	}
}

// guard is the privileged part of a sandbox's resolver.
type guard struct {
	cfg  ResolverConfig
	host []netip.Addr

	mu  sync.Mutex // guards nft: one batch at a time
	nft *nftables.Conn
}

// servePins answers the DNS part's pinRequests on conn, one at a time,
// until conn ends; readyc is closed on the ready word.
func (g *guard) servePins(conn *net.UnixConn, readyc chan struct{}) error {
	buf := make([]byte, maxPinMessage)
	isReady := false
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("it closed its channel")
		}
		var req pinRequest
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			return fmt.Errorf("it sent %d bytes that say nothing: %w", n, err)
		}
		if req.ID == 0 {
			if !isReady {
				isReady = true
				close(readyc)
			}
			continue
		}
		reply := pinReply{ID: req.ID}
		if err := g.pin(req); err != nil {
			reply.Error = err.Error()
		}
		b, _ := json.Marshal(reply)
		if _, err := conn.Write(b); err != nil {
			return err
		}
	}
}

// pin checks req against the policy, as the DNS part did (it parses what
// the sandbox and upstream send; it is not trusted to have done it), and
// pins its addresses for the ports the policy gives its chain.
func (g *guard) pin(req pinRequest) error {
	if len(req.Chain) == 0 || req.Chain[0] != req.Name || len(req.Addrs) == 0 || len(req.Addrs) > maxPins {
		return fmt.Errorf("pin %s: not an answer", req.Name)
	}
	for _, n := range req.Chain {
		if !validName(n) {
			return fmt.Errorf("pin %s: %q is not a name", req.Name, n)
		}
	}
	ports, denied, ok := g.cfg.Policy.ChainPorts(req.Name, req.Chain)
	if !ok {
		return fmt.Errorf("pin %s: the policy does not allow it", req.Name)
	}
	for _, a := range req.Addrs {
		if !g.cfg.Policy.AnswerAllowed(a, g.host) {
			return fmt.Errorf("pin %s: the policy refuses %s", req.Name, a)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return pin(g.nft, g.cfg.Table, req.Addrs, ports, denied, time.Duration(req.TTL)*time.Second)
}

// pinClient is the DNS part's end of the channel: pin asks and waits.
type pinClient struct {
	conn *net.UnixConn

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan string
}

func newPinClient(conn *net.UnixConn) *pinClient {
	return &pinClient{conn: conn, waiting: map[uint64]chan string{}}
}

// ready tells the privileged part that the DNS part answers.
func (p *pinClient) ready() error {
	b, _ := json.Marshal(pinRequest{})
	_, err := p.conn.Write(b)
	return err
}

// pin asks the privileged part to pin req's addresses, and waits for its
// word.
func (p *pinClient) pin(req pinRequest) error {
	ch := make(chan string, 1)
	p.mu.Lock()
	p.next++
	req.ID = p.next
	p.waiting[req.ID] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiting, req.ID)
		p.mu.Unlock()
	}()
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := p.conn.Write(b); err != nil {
		return err
	}
	t := time.NewTimer(resolverTimeout)
	defer t.Stop()
	select {
	case e := <-ch:
		if e != "" {
			return errors.New(e)
		}
		return nil
	case <-t.C:
		return errors.New("the resolver's privileged part does not answer")
	}
}

// run hands the privileged part's replies to the pins waiting for them,
// until the channel ends.
func (p *pinClient) run() error {
	buf := make([]byte, maxPinMessage)
	for {
		n, err := p.conn.Read(buf)
		if err != nil {
			return fmt.Errorf("the resolver's privileged part: %w", err)
		}
		if n == 0 {
			return errors.New("the resolver's privileged part is gone")
		}
		var r pinReply
		if err := json.Unmarshal(buf[:n], &r); err != nil {
			return err
		}
		p.mu.Lock()
		if ch, ok := p.waiting[r.ID]; ok {
			ch <- r.Error
		}
		p.mu.Unlock()
	}
}

// keepOnlyNetAdmin lowers every thread's capabilities to CAP_NET_ADMIN,
// effective and permitted, none inheritable (and so none ambient: nothing
// this process starts has any).
func keepOnlyNetAdmin() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	data[0].Effective, data[0].Permitted = 1<<unix.CAP_NET_ADMIN, 1<<unix.CAP_NET_ADMIN
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		if e == syscall.ENOTSUP {
			return fmt.Errorf("keep only CAP_NET_ADMIN: %s was built with cgo, whose threads Go cannot reach; it must be built with CGO_ENABLED=0", ResolverName)
		}
		return fmt.Errorf("keep only CAP_NET_ADMIN: %w", e)
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return fmt.Errorf("set no_new_privs: %w", e)
	}
	return nil
}

// watchTable watches nftables' deletions: changed gets an error wrapping
// errTableChanged once one touches the sandbox's table, or nil if the
// watch ends (its messages were lost: the caller polls then).
func (g *guard) watchTable(ctx context.Context) (changed <-chan error, stop func()) {
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
					if what := g.ours(ev); what != "" {
						ch <- fmt.Errorf("table %s: %s deleted: %w", g.cfg.Table, what, errTableChanged)
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
func (g *guard) ours(ev *nftables.MonitorEvent) string {
	switch d := ev.Data.(type) {
	case *nftables.Table:
		if ev.Type == nftables.MonitorEventTypeDelTable && d.Name == g.cfg.Table {
			return "the table"
		}
	case *nftables.Chain:
		if ev.Type == nftables.MonitorEventTypeDelChain && d.Table != nil && d.Table.Name == g.cfg.Table {
			return "chain " + d.Name
		}
	case *nftables.Rule:
		if ev.Type == nftables.MonitorEventTypeDelRule && d.Table != nil && d.Table.Name == g.cfg.Table {
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
func (g *guard) checkTable() error {
	n := &Network{ID: g.cfg.Table, Host: g.cfg.Link, Gateway: g.cfg.Gateway, Addr: g.cfg.Gateway.Next()}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.tableExistsLocked() {
		return fmt.Errorf("table %s is gone: %w", g.cfg.Table, errTableChanged)
	}
	if err := n.checkTable(g.nft, g.cfg.Policy); errors.Is(err, errTableChanged) {
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

// failClosed takes the sandbox's link down (it may be gone: the sandbox
// was removed) and says why the resolver ends: why, the table's change.
func (g *guard) failClosed(why error) error {
	l, err := netlink.LinkByName(g.cfg.Link)
	if err != nil {
		return fmt.Errorf("resolver: %w, and link %s: %w", why, g.cfg.Link, err)
	}
	if err := netlink.LinkSetDown(l); err != nil {
		return fmt.Errorf("resolver: %w: take link %s down: %w", why, g.cfg.Link, err)
	}
	return fmt.Errorf("resolver: %w: link %s taken down", why, g.cfg.Link)
}

// tableExistsLocked reports whether the sandbox's table is there (true if
// that cannot be told). The caller holds g.mu.
func (g *guard) tableExistsLocked() bool {
	t, err := inetTable(g.nft, g.cfg.Table)
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
