package sandbox

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGrowSendBuffer grows a Unix socket's send buffer past the host's
// default, as a copy into a sandbox does: to copyInSendBuffer as root
// (CAP_NET_ADMIN), else at least not below what it was.
func TestGrowSendBuffer(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, peer := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	defer f.Close()
	defer peer.Close()
	before, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		t.Fatal(err)
	}
	growSendBuffer(f, copyInSendBuffer)
	after, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		t.Fatal(err)
	}
	want := before
	if os.Geteuid() == 0 {
		want = copyInSendBuffer // Linux reports twice what was set
	}
	if after < want {
		t.Fatalf("send buffer %d after growing it to %d (was %d), want at least %d", after, copyInSendBuffer, before, want)
	}
	// Still non-blocking: growing it did not go through Fd.
	if fl, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("flags %#x %v: the socket became blocking", fl, err)
	}
}
