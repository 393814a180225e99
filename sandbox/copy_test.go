package sandbox

import (
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
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

// TestCopyError: a failed copy's kind from the agent becomes its errdefs
// kind, the agent's program name and kind words not repeated; a full /tmp
// says so.
func TestCopyError(t *testing.T) {
	for _, tc := range []struct {
		kind, msg, want string
		is              func(error) bool
	}{
		{wire.CopyNoSpace, "flmbox-agent: extract big: write (1 of 2 bytes): no space left on device: resource exhausted",
			"extract big: write (1 of 2 bytes): no space left on device: the sandbox's /tmp is full", errdefs.IsResourceExhausted},
		{wire.CopyNotFound, "flmbox-agent: archive /tmp/x: x: no such file or directory: not found",
			"archive /tmp/x: x: no such file or directory: not found", errdefs.IsNotFound},
		{wire.CopyPermissionDenied, "flmbox-agent: archive /etc/shadow: shadow: permission denied",
			"archive /etc/shadow: shadow: permission denied", errdefs.IsPermissionDenied},
		{wire.CopyTooLarge, "flmbox-agent: extract a: the files are over 1 bytes: too large: out of range",
			"extract a: the files are over 1 bytes: too large: out of range", errdefs.IsOutOfRange},
		{"", "flmbox-agent: /dev/null is a character device: only regular files, directories and symbolic links are copied",
			"/dev/null is a character device: only regular files, directories and symbolic links are copied: invalid argument", errdefs.IsInvalidArgument},
	} {
		err := copyError(&wire.Result{Error: tc.msg, Copied: &wire.CopyStats{Kind: tc.kind}})
		if !tc.is(err) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("kind %q: %v, want %q of its kind", tc.kind, err, tc.want)
		}
	}
}
