package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The egress figures' network, two namespaces the bench makes so that
// nothing it sends leaves the machine or touches the host's own namespace:
//
//	world   the internet: lo with internetAddr, where an HTTP server of
//	        the bench's process listens on :80; worldLink, 203.0.113.1/24
//	worker  where every flmbox process of the figures runs (nsenter
//	        --net): lo and workerLink, 203.0.113.2/24, the default route
//	        via world
//
// Egress sandboxes made in worker get their links, tables and forwarding
// there; worker's only way out is world.
const (
	// internetAddr is the world's server, in TEST-NET-2 (RFC 5737).
	internetAddr = "198.51.100.10"
	// netNSDir is where named network namespaces are bound (ip netns).
	netNSDir   = "/run/netns"
	workerLink = "uplink"
	worldLink  = "downlink"
	// maxServed bounds what the server's /bytes/N sends.
	maxServed = 1 << 30
)

var (
	workerNet = &net.IPNet{IP: net.IPv4(203, 0, 113, 2), Mask: net.CIDRMask(24, 32)}
	worldNet  = &net.IPNet{IP: net.IPv4(203, 0, 113, 1), Mask: net.CIDRMask(24, 32)}
)

// benchNet is the world and worker namespaces and the world's server.
type benchNet struct {
	// worker is the path of worker's namespace, for nsenter --net.
	worker string
	names  []string // the namespaces bound under netNSDir
	srv    *http.Server
	served chan error // the server's end
}

// newBenchNet makes the namespaces, named "flmbox-ID-world" and
// "flmbox-ID-worker" (ID unique to the run), and starts the server. On
// failure nothing is left.
func newBenchNet(id string) (*benchNet, error) {
	n := &benchNet{}
	if err := n.make(id); err != nil {
		return nil, errors.Join(fmt.Errorf("make the egress figures' network namespaces: %w", err), n.close())
	}
	return n, nil
}

func (n *benchNet) make(id string) error {
	world, worker, err := n.makeNamespaces("flmbox-"+id+"-world", "flmbox-"+id+"-worker")
	if err != nil {
		return err
	}
	defer world.Close()
	defer worker.Close()
	n.worker = filepath.Join(netNSDir, n.names[1])
	if err := link(worker, world); err != nil {
		return err
	}
	return n.serve(world)
}

// makeNamespaces makes and binds two new network namespaces on a thread of
// their own, which is never given back to Go: it ends with its goroutine.
func (n *benchNet) makeNamespaces(world, worker string) (w, k netns.NsHandle, err error) {
	type made struct {
		h   [2]netns.NsHandle
		err error
	}
	done := make(chan made, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread has left this process's namespace
		var m made
		for i, name := range []string{world, worker} {
			path := filepath.Join(netNSDir, name)
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				m.err = fmt.Errorf("network namespace %s exists already", path)
				break
			}
			n.names = append(n.names, name) // removed by close, even if only its file was made
			if m.h[i], m.err = netns.NewNamed(name); m.err != nil {
				m.err = fmt.Errorf("make network namespace %s: %w", name, m.err)
				break
			}
		}
		done <- m
	}()
	m := <-done
	if m.err != nil {
		m.h[0].Close()
		m.h[1].Close()
	}
	return m.h[0], m.h[1], m.err
}

// link joins worker to world by a veth pair and addresses and routes both.
func link(worker, world netns.NsHandle) error {
	hk, err := netlink.NewHandleAt(worker)
	if err != nil {
		return err
	}
	defer hk.Close()
	hw, err := netlink.NewHandleAt(world)
	if err != nil {
		return err
	}
	defer hw.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: workerLink}, PeerName: worldLink, PeerNamespace: netlink.NsFd(world)}
	if err := hk.LinkAdd(veth); err != nil {
		return fmt.Errorf("add the link from worker to world: %w", err)
	}
	// Each side: its link's address, its link and loopback up.
	for _, side := range []struct {
		h    *netlink.Handle
		link string
		addr *net.IPNet
	}{{hk, workerLink, workerNet}, {hw, worldLink, worldNet}} {
		l, err := side.h.LinkByName(side.link)
		if err != nil {
			return err
		}
		lo, err := side.h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := side.h.AddrAdd(l, &netlink.Addr{IPNet: side.addr}); err != nil {
			return fmt.Errorf("address %s: %w", side.link, err)
		}
		if err := errors.Join(side.h.LinkSetUp(l), side.h.LinkSetUp(lo)); err != nil {
			return fmt.Errorf("set %s up: %w", side.link, err)
		}
	}
	lo, err := hw.LinkByName("lo")
	if err != nil {
		return err
	}
	server := &net.IPNet{IP: net.ParseIP(internetAddr), Mask: net.CIDRMask(32, 32)}
	if err := hw.AddrAdd(lo, &netlink.Addr{IPNet: server}); err != nil {
		return fmt.Errorf("address world's server: %w", err)
	}
	l, err := hk.LinkByName(workerLink)
	if err != nil {
		return err
	}
	if err := hk.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: worldNet.IP}); err != nil {
		return fmt.Errorf("route worker through world: %w", err)
	}
	return nil
}

// serve starts the world's HTTP server on internetAddr:80, in world: its
// goroutine enters world on a thread it never gives back, listens and
// serves.
func (n *benchNet) serve(world netns.NsHandle) error {
	chunk := make([]byte, 1<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bytes/{n}", func(w http.ResponseWriter, req *http.Request) {
		size, err := strconv.ParseInt(req.PathValue("n"), 10, 64)
		if err != nil || size < 0 || size > maxServed {
			http.Error(w, "want /bytes/N, N from 0 to 1 GiB", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		for size > 0 {
			k, err := w.Write(chunk[:min(size, int64(len(chunk)))])
			if err != nil {
				return
			}
			size -= int64(k)
		}
	})
	n.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	listening := make(chan error, 1)
	n.served = make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread stays in world
		if err := netns.Set(world); err != nil {
			listening <- fmt.Errorf("enter world: %w", err)
			return
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(internetAddr, "80"))
		listening <- err
		if err == nil {
			n.served <- n.srv.Serve(ln)
		}
	}()
	if err := <-listening; err != nil {
		n.srv = nil
		return fmt.Errorf("listen in world: %w", err)
	}
	return nil
}

// close stops the server and removes the namespaces. A namespace goes
// when its last process does: close the sandboxes made in worker first.
func (n *benchNet) close() error {
	var errs []error
	if n.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := n.srv.Shutdown(ctx); err != nil {
			errs = append(errs, n.srv.Close())
		}
		if err := <-n.served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("world's server: %w", err))
		}
		n.srv = nil
	}
	for _, name := range n.names {
		path := filepath.Join(netNSDir, name)
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("unmount network namespace %s: %w", path, err))
		} else if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	n.names = nil
	return errors.Join(errs...)
}
