package snippet

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// watchHangup calls gone when the client closes its end of conn, and stops
// watching when stop is called.
//
// The client half-closes the connection after its request, so the socket
// reads EOF from then on and reading cannot tell a client that waits from a
// client that left. poll can: a socket whose peer closed both directions
// reports POLLHUP. The check runs in the runtime's network poller (edge
// triggered), so watching costs no thread: it runs again only when the
// socket's state changes.
func watchHangup(conn *net.UnixConn, gone func()) (stop func()) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		hungUp := false
		err := rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd)}}
			if n, err := unix.Poll(fds, 0); err != nil || n == 0 {
				return false
			}
			hungUp = fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
			return hungUp
		})
		if err == nil && hungUp {
			gone()
		}
	}()
	return func() {
		conn.SetReadDeadline(time.Unix(1, 0)) // wakes rc.Read
		<-done
		conn.SetReadDeadline(time.Time{})
	}
}
