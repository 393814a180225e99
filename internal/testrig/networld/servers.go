package networld

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// serve starts every server of the world.
func (w *World) serve() error {
	w.dns = newDNSServer(&w.hits)
	if err := w.serveDNS(); err != nil {
		return err
	}
	hello := http.HandlerFunc(helloHandler)
	web := []string{AllowedAddr, OtherAddr, PyPIAddr}
	for _, s := range []struct {
		service Service
		addrs   []string
		port    string
		h       http.Handler
	}{
		{HTTP, web, "80", w.pypiOr(hello)},
		{HTTPS, web, "443", http.HandlerFunc(tlsHandler)},
		{Metadata, []string{MetadataAddr}, "80", text("SECRET-METADATA")},
		{Private, []string{PrivateAddr}, "80", text("PRIVATE")},
		{V6, []string{WorldAddr6}, "80", hello},
	} {
		for _, a := range s.addrs {
			var tc *tls.Config
			if s.service == HTTPS {
				tc = &tls.Config{GetCertificate: w.ca.getCertificate}
			}
			if err := w.serveHTTP(w.world, s.service, net.JoinHostPort(a, s.port), s.h, tc); err != nil {
				return err
			}
		}
	}
	for _, port := range []string{"7", "9999"} {
		if err := w.serveUDP(w.world, Echo, net.JoinHostPort(AllowedAddr, port), nil); err != nil {
			return err
		}
	}
	return nil
}

// ListenWorker starts a server in the worker's network namespace on addr
// (network "tcp" or "udp"; port 0 picks one) that answers HOST-SERVICE to
// an HTTP request or a datagram, counted as Host; it returns the address
// it listens on, and stops when t ends.
func (w *World) ListenWorker(t testing.TB, network, addr string) string {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := inNetNS(w.worker, func() (err error) {
		if strings.HasPrefix(network, "udp") {
			pc, err = net.ListenPacket(network, addr)
		} else {
			ln, err = net.Listen(network, addr)
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen on %s %s in the worker: %v", network, addr, err)
	}
	if pc != nil {
		go w.answerUDP(pc, Host, []byte("HOST-SERVICE"))
		t.Cleanup(func() { pc.Close() })
		return pc.LocalAddr().String()
	}
	srv := &http.Server{Handler: w.count(Host, text("HOST-SERVICE"))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// serveHTTP serves h on addr in ns, over TLS if tc is not nil, counting
// requests as s.
func (w *World) serveHTTP(ns netns.NsHandle, s Service, addr string, h http.Handler, tc *tls.Config) error {
	var ln net.Listener
	if err := inNetNS(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: w.count(s, h), ErrorLog: discardLog}
	if tc != nil {
		srv.TLSConfig = tc
		ln = tls.NewListener(ln, tc)
	}
	go srv.Serve(ln)
	w.onClose(srv.Close)
	return nil
}

// serveUDP answers every datagram on addr in ns with reply, or with the
// datagram itself if reply is nil, counting datagrams as s.
func (w *World) serveUDP(ns netns.NsHandle, s Service, addr string, reply []byte) error {
	var pc net.PacketConn
	if err := inNetNS(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		return fmt.Errorf("listen on udp %s: %w", addr, err)
	}
	go w.answerUDP(pc, s, reply)
	w.onClose(pc.Close)
	return nil
}

func (w *World) answerUDP(pc net.PacketConn, s Service, reply []byte) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		w.hits.add(s, addrPort(pc.LocalAddr()), addrPort(from))
		out := reply
		if out == nil {
			out = buf[:n]
		}
		pc.WriteTo(out, from)
	}
}

// count counts each request to h as a hit on s.
func (w *World) count(s Service, h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		remote, _ := netip.ParseAddrPort(r.RemoteAddr)
		w.hits.add(s, addrPort(local), remote)
		h.ServeHTTP(rw, r)
	})
}

// pypiOr serves the index on PyPIAddr, counting its requests as PyPI too,
// and next everywhere else.
func (w *World) pypiOr(next http.Handler) http.Handler {
	ix := w.count(PyPI, w.pypi.handler(next))
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		if addrPort(local).Addr().Unmap().String() == PyPIAddr && (strings.HasPrefix(r.URL.Path, "/simple/") || strings.HasPrefix(r.URL.Path, "/files/")) {
			ix.ServeHTTP(rw, r)
			return
		}
		next.ServeHTTP(rw, r)
	})
}

// helloHandler answers "hello HOST from LOCAL-ADDRESS", or N bytes for
// /bytes/N.
func helloHandler(rw http.ResponseWriter, r *http.Request) {
	if n, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
		size, err := strconv.ParseInt(n, 10, 64)
		if err != nil || size < 0 {
			http.Error(rw, "bad size", http.StatusBadRequest)
			return
		}
		rw.Header().Set("Content-Length", n)
		io.Copy(rw, io.LimitReader(zeros{}, size))
		return
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	fmt.Fprintf(rw, "hello %s from %s", r.Host, local)
}

// tlsHandler answers "tls SNI host HOST".
func tlsHandler(rw http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(rw, "tls %s host %s", r.TLS.ServerName, r.Host)
}

// text answers s to every request.
func text(s string) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, s) })
}

// discardLog drops the servers' logs (such as a refused client's
// failed TLS handshake).
var discardLog = log.New(io.Discard, "", 0)

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
