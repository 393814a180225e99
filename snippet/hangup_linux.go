package snippet

import (
	"bytes"
	"net"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
	"golang.org/x/sys/unix"
)

// watchHangup calls gone(false) when the client closes its end of conn, and,
// if interruptible (wire.Request.Interruptible), gone(true) when the client
// shuts down its sending side: the client interrupts the call and waits for
// the answer. While interruptible, each wire.MemoryNudge the client sends
// calls nudge (wire.Request.MemoryNudges). It stops watching when stop is
// called.
//
// A client of before interrupts half-closes the connection after its
// request, so the socket reads EOF from then on and reading cannot tell a
// client that waits from a client that left. poll can: a socket whose peer
// closed both directions reports POLLHUP. An interruptible client keeps
// sending open, so EOF is its interrupt; whatever else it sends after the
// request (the encoder's newline, its nudges) is read, and dropped once
// nudge has been called for the nudges. The check runs in the
// runtime's network poller (edge triggered), so watching costs no thread: it
// runs again only when the socket's state changes.
func watchHangup(conn *net.UnixConn, interruptible bool, nudge func(), gone func(interrupt bool)) (stop func()) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		hungUp, interrupted := false, false
		err := rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, 0); err != nil || n == 0 {
				return false
			}
			if fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
				hungUp = true
				return true
			}
			if interruptible && fds[0].Revents&unix.POLLIN != 0 {
				var nudged bool
				interrupted, nudged = readToEOF(int(fd))
				if nudged && !interrupted {
					nudge()
				}
			}
			return interrupted
		})
		switch {
		case err != nil:
		case hungUp:
			gone(false)
		case interrupted:
			gone(true)
		}
	}()
	return func() {
		conn.SetReadDeadline(time.Unix(1, 0)) // wakes rc.Read
		<-done
		conn.SetReadDeadline(time.Time{})
	}
}

// readToEOF reads and drops what the non-blocking socket fd holds, and
// says whether it reached EOF and whether it read a wire.MemoryNudge.
func readToEOF(fd int) (eof, nudged bool) {
	var buf [512]byte
	for {
		n, _, err := unix.Recvfrom(fd, buf[:], unix.MSG_DONTWAIT)
		switch {
		case err == unix.EINTR:
		case err != nil:
			return false, nudged // EAGAIN: nothing more for now
		case n == 0:
			return true, nudged
		default:
			nudged = nudged || bytes.IndexByte(buf[:n], wire.MemoryNudge) >= 0
		}
	}
}
