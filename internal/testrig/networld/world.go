// Package networld builds, for one test, a private "internet" of two
// network namespaces, so that a test of flmbox's network policy never sends
// a packet beyond namespaces it made itself.
//
// "worker" is where flmbox runs (Command): loopback and one veth, eth0,
// 203.0.113.2/24 and fd77::2/64, with a default route via 203.0.113.1.
// "world", at the veth's other end (203.0.113.1/24, fd77::1/64), holds
// every server, in this process, on addresses of its loopback:
//
//	192.0.2.53:53     DNS, UDP and TCP (SetA, SetAAAA, Queries)
//	198.51.100.10-12:80  HTTP: "hello HOST from ADDR", /bytes/N (HTTP);
//	                     198.51.100.12 is also a PEP 503 index (PyPI, AddWheel)
//	198.51.100.10-12:443 HTTPS with a certificate per SNI from CAPEM (HTTPS)
//	198.51.100.10:7,9999 UDP echo (Echo)
//	169.254.169.254:80   fake cloud metadata: SECRET-METADATA (Metadata)
//	10.77.0.5:80         a private service: PRIVATE (Private)
//	[fd77::1]:80         HTTP over IPv6 (V6)
//
// Every server counts its hits per source (Hits, HitsFrom, HitsTo), so a
// test can assert a server was never reached. World answers a worker
// address only: traffic from a namespace behind the worker must be
// masqueraded to reach it. ListenWorker serves in worker itself, for the
// host's own addresses.
//
// Start needs root. Sockets are made in a namespace by a goroutine that
// locks its OS thread, enters the namespace and never unlocks, so the
// thread ends with it (inNetNS); the socket stays in the namespace. The
// package is a test rig: nothing in flmbox links it.
package networld

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/vishvananda/netns"
)

// Addresses of the world, as strings a test can paste into a command line.
const (
	WorkerAddr   = "203.0.113.2"     // the worker's uplink address
	GatewayAddr  = "203.0.113.1"     // world's end of the veth, the worker's gateway
	AllowedAddr  = "198.51.100.10"   // allowed.test and sub.wild.test
	OtherAddr    = "198.51.100.11"   // other.test
	PyPIAddr     = "198.51.100.12"   // pypi.test
	DNSAddr      = "192.0.2.53"      // the DNS server
	PrivateAddr  = "10.77.0.5"       // private.test
	MetadataAddr = "169.254.169.254" // meta.test
	WorldAddr6   = "fd77::1"         // v6.test, world's IPv6 end of the veth
	WorkerAddr6  = "fd77::2"         // the worker's IPv6 address
)

// netnsDir is where named network namespaces are bound, as by ip netns.
const netnsDir = "/run/netns"

// NamePrefix starts the name of every namespace the package makes.
const NamePrefix = "networld-"

// World is a private internet of two network namespaces and its servers,
// torn down when the test that started it ends.
type World struct {
	workerName, worldName string
	worker, world         netns.NsHandle

	dns  *dnsServer
	hits hitCounter
	ca   *certAuthority
	pypi *index

	mu      sync.Mutex
	closers []func() error // servers, closed before the namespaces go
}

// Start builds a world for t and removes it (servers, namespaces, links,
// mounts) when t ends. It skips t unless it runs as root.
func Start(t testing.TB) *World {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("networld needs root to make network namespaces")
	}
	w, err := start()
	if err != nil {
		t.Fatalf("start a networld: %v", err)
	}
	t.Cleanup(func() {
		if err := w.close(); err != nil {
			t.Errorf("remove the networld: %v", err)
		}
	})
	return w
}

func start() (w *World, err error) {
	var id [4]byte
	rand.Read(id[:])
	suffix := hex.EncodeToString(id[:])
	w = &World{workerName: NamePrefix + "worker-" + suffix, worldName: NamePrefix + "world-" + suffix, worker: -1, world: -1}
	defer func() {
		if err != nil {
			err = errors.Join(err, w.close())
		}
	}()
	if w.worker, err = newNamed(w.workerName); err != nil {
		return w, err
	}
	if w.world, err = newNamed(w.worldName); err != nil {
		return w, err
	}
	if err = w.wire(); err != nil {
		return w, err
	}
	if w.ca, err = newCertAuthority(); err != nil {
		return w, err
	}
	w.pypi = newIndex()
	return w, w.serve()
}

// close stops the servers and removes both namespaces.
func (w *World) close() error {
	w.mu.Lock()
	closers := w.closers
	w.closers = nil
	w.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i](); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, ns := range []struct {
		name string
		h    *netns.NsHandle
	}{{w.workerName, &w.worker}, {w.worldName, &w.world}} {
		if *ns.h >= 0 {
			ns.h.Close()
			*ns.h = -1
			if err := netns.DeleteNamed(ns.name); err != nil {
				errs = append(errs, fmt.Errorf("delete network namespace %s: %w", ns.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// onClose registers f to run when the world is removed, before its
// namespaces are.
func (w *World) onClose(f func() error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closers = append(w.closers, f)
}

// WorkerNetNS is the path of the worker's network namespace, for nsenter
// --net or setns.
func (w *World) WorkerNetNS() string { return filepath.Join(netnsDir, w.workerName) }

// WorldNetNS is the path of the world's network namespace.
func (w *World) WorldNetNS() string { return filepath.Join(netnsDir, w.worldName) }

// Command returns a command that runs name with args in the worker's
// network namespace, and in this process's mount namespace (nsenter --net,
// nothing else), so that what it mounts is the host's.
func (w *World) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + w.WorkerNetNS(), "--", name}, args...)...)
}

// newNamed makes a network namespace bound at /run/netns/name, as ip netns
// add does, and returns a handle to it.
func newNamed(name string) (netns.NsHandle, error) {
	var h netns.NsHandle
	err := onFreshThread(func() error {
		// NewNamed moves this thread into the new namespace: the
		// thread ends with onFreshThread's goroutine.
		var err error
		h, err = netns.NewNamed(name)
		if err != nil {
			return fmt.Errorf("make network namespace %s: %w", name, err)
		}
		return nil
	})
	return h, err
}

// inNetNS runs fn on an OS thread of its own that is in ns. Sockets fn
// makes belong to ns, whichever goroutine uses them later.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	return onFreshThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return fn()
	})
}

// onFreshThread runs fn on a goroutine locked to its OS thread, which it
// never unlocks: Go ends the thread with the goroutine, so whatever fn
// changed about the thread (its network namespace) is never seen by
// another goroutine.
func onFreshThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- fn()
	}()
	return <-errc
}
