package networld

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netns"
)

// DialWorker connects to addr, an IP address and port, from the worker's
// network namespace, as a program running there would. It refuses a host
// name: resolve it with WorkerResolver first (Go's own dialer would race
// several addresses on other threads, outside the namespace).
func (w *World) DialWorker(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return nil, fmt.Errorf("dial %s from the worker: want an IP address: %w", addr, err)
	}
	d := net.Dialer{Control: w.inWorker}
	var c net.Conn
	err = inNetNS(w.worker, func() (err error) {
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// inWorker fails unless the thread that made a socket is in the worker's
// namespace: a socket of the host's namespace could reach the Internet.
func (w *World) inWorker(network, address string, _ syscall.RawConn) error {
	cur, err := netns.Get()
	if err != nil {
		return err
	}
	defer cur.Close()
	if !cur.Equal(w.worker) {
		return fmt.Errorf("networld: a socket for %s %s outside the worker's namespace", network, address)
	}
	return nil
}

// WorkerResolver returns a resolver that asks the world's DNS server from
// the worker's namespace, whatever the host's /etc/resolv.conf names.
func (w *World) WorkerResolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return w.DialWorker(ctx, network, net.JoinHostPort(DNSAddr, "53"))
	}}
}

// WorkerClient returns an HTTP client whose connections are made from the
// worker's namespace, that resolves names with WorkerResolver and trusts
// CAPEM. It uses no proxy.
func (w *World) WorkerClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(w.CAPEM())
	r := w.WorkerResolver()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := r.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		var last error
		for _, ip := range ips {
			c, err := w.DialWorker(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
			if err == nil {
				return c, nil
			}
			last = err
		}
		return nil, last
	}
	return &http.Client{Transport: &http.Transport{
		DialContext:       dial,
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: true,
	}}
}
