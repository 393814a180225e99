package networld

import (
	"net"
	"net/netip"
	"sync"
)

// Service names a server (or a set of them) of the world, for Hits.
type Service string

// Services.
const (
	HTTP     Service = "http"     // :80 of allowed, other and pypi.test: a request
	HTTPS    Service = "https"    // :443 of the same: a request
	PyPI     Service = "pypi"     // the index on pypi.test: a request (also an HTTP hit)
	DNS      Service = "dns"      // 192.0.2.53:53, UDP or TCP: a query
	Echo     Service = "echo"     // UDP echo on 198.51.100.10:7 and :9999: a datagram
	Metadata Service = "metadata" // 169.254.169.254:80: a request
	Private  Service = "private"  // 10.77.0.5:80: a request
	V6       Service = "v6"       // [fd77::1]:80: a request
	Host     Service = "host"     // the worker's own servers (ListenWorker): a request or datagram
)

// hitKey is one server address and one source address.
type hitKey struct {
	local  netip.AddrPort
	source netip.Addr
}

// hitCounter counts hits per service, server address and source.
type hitCounter struct {
	mu sync.Mutex
	n  map[Service]map[hitKey]int
}

// add counts a hit on s at local from remote.
func (c *hitCounter) add(s Service, local, remote netip.AddrPort) {
	k := hitKey{local: unmap(local), source: remote.Addr().Unmap()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[Service]map[hitKey]int{}
	}
	if c.n[s] == nil {
		c.n[s] = map[hitKey]int{}
	}
	c.n[s][k]++
}

// sum adds the hits on s for which keep holds.
func (c *hitCounter) sum(s Service, keep func(hitKey) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for k, n := range c.n[s] {
		if keep(k) {
			total += n
		}
	}
	return total
}

// Hits returns how many times s was reached, from anywhere.
func (w *World) Hits(s Service) int {
	return w.hits.sum(s, func(hitKey) bool { return true })
}

// HitsFrom returns how many times s was reached from source, an IP
// address such as "203.0.113.2".
func (w *World) HitsFrom(s Service, source string) int {
	return w.hits.sum(s, func(k hitKey) bool { return k.source.String() == source })
}

// HitsTo returns how many times s was reached on local, an IP address
// ("198.51.100.11") or an address and port ("198.51.100.10:9999").
func (w *World) HitsTo(s Service, local string) int {
	return w.hits.sum(s, func(k hitKey) bool { return k.local.String() == local || k.local.Addr().String() == local })
}

// unmap returns ap with an IPv4-mapped address unmapped.
func unmap(ap netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) }

// addrPort returns a's address and port (zero for an address that has
// none).
func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort()
	case *net.UDPAddr:
		return a.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}
