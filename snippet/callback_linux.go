package snippet

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Callbacks (wire.Callback): for a call that asks, the agent listens on a
// Unix socket of its own in CallbackDir, a directory that only the agent
// can write (the snippet cannot replace the socket), and names it in the
// snippet's environment. Each connection to it from a process of the call
// (its process or a descendant: SO_PEERCRED, then the parent chain in
// /proc) is announced to the client on the call's connection (wire.Event);
// the client connects to the agent again with an Attach request, and the
// agent copies bytes both ways between the two connections, within the
// call's limits, until either side closes, the call ends or a limit is hit.
// To spare that round trip, the client keeps a standby connection attached
// to the call's callbacks (wire.Event.Ready), which the next connection
// takes at once; a framed one (wire.CallbackData) carries one connection
// after another. Nothing else of the host is reachable through it: the
// agent only ever forwards to connections the client made to it.

// attachTimeout bounds how long a snippet's callback connection waits for
// the client to attach it: longer than the client's own bound on dialing
// its server (sandbox's dialTimeout, 10 s).
const attachTimeout = 15 * time.Second

// callback is one call's callback socket and its connections.
type callback struct {
	a      *Agent
	id     string
	path   string
	ln     *net.UnixListener
	conns  int
	bytes  int64         // the call's budget, both ways, all connections
	spent  atomic.Int64  // bytes forwarded so far (past bytes: cut)
	idle   time.Duration // 0: no idle cut
	notify func(wire.Event) error
	root   atomic.Int64 // the pid of the call's process, once it has one

	accepting sync.WaitGroup // the accept loop

	mu      sync.Mutex
	n       int                      // connections accepted from the call
	pending map[string]*net.UnixConn // announced, not attached yet
	standby []*hostEnd               // the client's, waiting for a connection
	open    map[net.Conn]struct{}    // both ends of forwarded connections
	closed  bool
	stats   wire.CallbackStats
	wg      sync.WaitGroup
}

// openCallback opens the callback socket of a call with cb, announcing its
// connections with notify; env is what the snippet is to find it by.
func (a *Agent) openCallback(cb *wire.Callback, notify func(wire.Event) error) (c *callback, env []string, err error) {
	if notify == nil {
		return nil, nil, errors.New("callbacks need the agent's connection to the client (Serve)")
	}
	dir, err := a.callbackDir()
	if err != nil {
		return nil, nil, err
	}
	var id [12]byte
	// getrandom(2) itself: crypto/rand would add Go's FIPS module, a
	// megabyte of the agent's binary, which every sandbox maps.
	if _, err := unix.Getrandom(id[:], 0); err != nil {
		return nil, nil, fmt.Errorf("callback: %w", err)
	}
	c = &callback{a: a, id: hex.EncodeToString(id[:]), notify: notify,
		pending: map[string]*net.UnixConn{}, open: map[net.Conn]struct{}{}}
	c.conns, c.bytes, c.idle = cb.Limits()
	c.path = filepath.Join(dir, c.id+".sock")
	if c.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: c.path, Net: "unix"}); err != nil {
		return nil, nil, fmt.Errorf("open the callback socket: %w", err)
	}
	// Connecting takes write permission on the socket: the snippets' user
	// has it, and nothing else there (the directory is the agent's).
	if err := os.Chmod(c.path, 0o666); err != nil {
		c.ln.Close()
		return nil, nil, fmt.Errorf("open the callback socket: %w", err)
	}
	a.cbMu.Lock()
	if a.callbacks == nil {
		a.callbacks = map[string]*callback{}
	}
	a.callbacks[c.id] = c
	a.cbMu.Unlock()
	if err := notify(wire.Event{Ready: c.id, Frames: !a.noFrames}); err != nil {
		c.close()
		return nil, nil, fmt.Errorf("announce the callbacks: %w", err)
	}
	c.accepting.Add(1)
	go c.accept()
	env = []string{wire.CallbackSocketEnv + "=" + c.path}
	for _, name := range cb.Env {
		env = append(env, name+"="+c.path)
	}
	return c, env, nil
}

// callbackDir makes the agent's CallbackDir, and checks that only the agent
// can write it.
func (a *Agent) callbackDir() (string, error) {
	dir := a.CallbackDir
	if dir == "" {
		return "", errors.New("this agent takes no callbacks (no callback directory)")
	}
	for _, clean := range a.CleanDirs {
		if rel, err := filepath.Rel(clean, dir); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("the callback directory %s is in %s, which snippets can write", dir, clean)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("make the callback directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return "", fmt.Errorf("check the callback directory: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return "", fmt.Errorf("the callback directory %s is not the agent's alone (mode %o, owner %d)", dir, st.Mode, st.Uid)
	}
	return dir, nil
}

// accept takes the snippet's connections until the listener is closed. A
// connection that takes a standby is forwarded on this goroutine, and
// another takes the next connections: one hop fewer on the way of the
// snippet's first bytes.
func (c *callback) accept() {
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			c.accepting.Done()
			return
		}
		host := c.take(conn)
		if host == nil {
			continue
		}
		c.accepting.Add(1) // this goroutine is counted still
		go c.accept()
		c.accepting.Done()
		c.forwarded(conn, host, true)
		return
	}
}

// take forwards conn, or announces it to the client, or refuses it. A
// connection that takes a standby connection of the client's is returned
// with it, counted in c.wg, for the caller to forward (forwarded).
func (c *callback) take(conn *net.UnixConn) (host *hostEnd) {
	if !c.fromCall(conn) {
		c.refuse(conn)
		return nil
	}
	c.mu.Lock()
	if c.closed || c.n >= c.conns || c.spent.Load() >= c.bytes {
		c.mu.Unlock()
		c.refuse(conn)
		return nil
	}
	c.n++
	if len(c.standby) > 0 {
		host = c.standby[0]
		c.standby = c.standby[1:]
		c.openLocked(conn, host)
		c.mu.Unlock()
		return host
	}
	id := c.id + "-" + strconv.Itoa(c.n)
	c.pending[id] = conn
	c.mu.Unlock()
	if err := c.notify(wire.Event{Callback: id}); err != nil {
		c.drop(id)
		return nil
	}
	time.AfterFunc(attachTimeout, func() { c.drop(id) })
	return nil
}

// drop refuses the connection id if it still waits for the client.
func (c *callback) drop(id string) {
	c.mu.Lock()
	conn := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if conn != nil {
		c.refuse(conn)
	}
}

// refuse closes a connection of the snippet's at once: it reads EOF.
func (c *callback) refuse(conn *net.UnixConn) {
	conn.Close()
	c.mu.Lock()
	c.stats.Refused++
	c.mu.Unlock()
}

// fromCall says whether conn's peer is the call's process or one of its
// descendants.
func (c *callback) fromCall(conn *net.UnixConn) bool {
	root := int(c.root.Load())
	rc, err := conn.SyscallConn()
	if err != nil || root <= 0 {
		return false
	}
	var cred *unix.Ucred
	rc.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil {
		return false
	}
	pid := int(cred.Pid)
	for range 256 { // a parent chain longer than that is refused
		if pid == root {
			return true
		}
		if pid <= 1 {
			return false
		}
		if pid, err = parentOf(pid); err != nil {
			return false
		}
	}
	return false
}

// parentOf returns the parent of process pid.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 2 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.Atoi(fields[1])
}

// attach forwards the connection id to host, the client's connection, or
// refuses it if the client could not reach its server (refused). It takes
// host.
func (a *Agent) attach(id string, host net.Conn, refused bool) {
	cbID, _, _ := strings.Cut(id, "-")
	a.cbMu.Lock()
	c := a.callbacks[cbID]
	a.cbMu.Unlock()
	if c == nil {
		host.Close()
		return
	}
	c.mu.Lock()
	conn := c.pending[id]
	delete(c.pending, id)
	if conn == nil || c.closed {
		c.mu.Unlock()
		host.Close()
		if conn != nil {
			conn.Close()
		}
		return
	}
	if refused {
		c.mu.Unlock()
		host.Close()
		c.refuse(conn)
		return
	}
	end := &hostEnd{conn: rawIO(host)}
	c.openLocked(conn, end)
	c.mu.Unlock()
	go c.forwarded(conn, end, false)
}

// hostEnd is a connection of the client's that carries the snippet's
// connections: framed (r is set), one after another, or one connection's
// bytes alone.
type hostEnd struct {
	conn net.Conn
	r    *bufio.Reader // conn's, for a framed connection
}

// maxStandby is the most standby connections a call keeps.
const maxStandby = 4

// standby keeps host, a connection of the client's, for the next connection
// of the call's callbacks id; framed: for one after another.
func (a *Agent) standby(id string, host net.Conn, framed bool) {
	a.standbys.Add(1)
	a.cbMu.Lock()
	c := a.callbacks[id]
	a.cbMu.Unlock()
	if c == nil {
		host.Close()
		return
	}
	end := &hostEnd{conn: rawIO(host)}
	if framed {
		end.r = bufio.NewReaderSize(end.conn, 32<<10)
	}
	c.release(end)
}

// release keeps host for the next connection, unless the call ended or
// enough wait already.
func (c *callback) release(host *hostEnd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.standby) >= maxStandby {
		host.conn.Close()
		return
	}
	c.standby = append(c.standby, host)
}

// openLocked counts conn forwarded to host, in c.wg until forwarded ends;
// c.mu is held.
func (c *callback) openLocked(conn *net.UnixConn, host *hostEnd) {
	c.stats.Connections++
	c.open[conn], c.open[host.conn] = struct{}{}, struct{}{}
	c.wg.Add(1)
}

// forwarded forwards conn to host (see forward), for a connection counted
// by openLocked.
func (c *callback) forwarded(conn *net.UnixConn, host *hostEnd, standby bool) {
	defer c.wg.Done()
	reuse := c.forward(conn, host, standby)
	c.mu.Lock()
	delete(c.open, conn)
	delete(c.open, host.conn)
	c.mu.Unlock()
	if reuse {
		c.release(host)
	} else {
		host.conn.Close()
	}
}

// forward copies bytes both ways between the snippet's conn and the
// client's host until both directions end, then closes conn; it says
// whether host can carry the next connection (framed, and not cut), else
// the caller closes it. A direction ends at EOF (passed on as a half close,
// unless the other direction has ended: then closing both passes it on,
// with one call across to the host fewer; to a framed host, as
// wire.CallbackEnd), or cuts the connection (both closed at once) once the
// call's bytes cross c.bytes, or after c.idle (if set) without a byte
// either way.
//
// A standby connection of the client's waits for a first byte
// (wire.CallbackWake) before it dials its server: it is sent with the
// snippet's first bytes, in one write, or alone if the snippet sends
// nothing within wakeWait (it waits for the server to speak first). Every
// write to the host costs a crossing of gVisor's host socket, the most
// costly step of a round trip.
func (c *callback) forward(conn *net.UnixConn, host *hostEnd, standby bool) (reuse bool) {
	defer conn.Close()
	l := &link{}
	l.cut = func() {
		l.cutOff.Store(true)
		conn.Close()
		host.conn.Close()
	}
	if c.idle > 0 {
		l.touch()
	}
	var from io.Reader = host.conn
	if host.r != nil {
		from = wire.NewCallbackStream(host.r)
	}
	// The snippet's bytes are copied on this goroutine; the host's, on one
	// started once the wake byte is sent (nothing comes before).
	var wg sync.WaitGroup
	snippet := rawIO(conn)
	in := func() { wg.Go(func() { c.copy(snippet, host.conn, from, false, l, false, false, nil) }) }
	if !standby {
		in()
		in = nil
	}
	c.copy(host.conn, snippet, snippet, host.r != nil, l, true, standby, in)
	wg.Wait()
	return host.r != nil && !l.cutOff.Load()
}

// rawIO returns conn, a Unix socket's connection, read and written with
// raw system calls (rawConn), or conn itself if it is not one.
func rawIO(conn net.Conn) net.Conn {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return conn
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return conn
	}
	return &rawConn{UnixConn: uc, rc: rc}
}

// rawConn reads and writes a non-blocking socket with unix.RawSyscall, not
// through the scheduler's system call hooks: the agent runs on one P
// (GOMAXPROCS=1), and under gVisor a read or write (to the host's socket
// above all) often lasts longer than a tick of the Go runtime's sysmon (20
// us), which then takes the P away from the thread in the call, has
// another thread woken for it, and keeps polling every 20 us (a nanosleep
// each time). The sockets are non-blocking: a raw call never blocks, and
// EAGAIN waits in the poller as usual (RawConn), with the deadlines.
type rawConn struct {
	*net.UnixConn
	rc syscall.RawConn
}

func (c *rawConn) Read(p []byte) (int, error) { return c.read(p, true) }

// errNothingYet is read's error when the socket holds nothing and the read
// is not to wait.
var errNothingYet = errors.New("nothing to read yet")

// read reads p from the socket, waiting in the poller for bytes if wait,
// else failing with errNothingYet when there are none.
func (c *rawConn) read(p []byte, wait bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				if !wait {
					errno = e
					return true
				}
				return false
			}
			n, errno = int(r), e
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno == unix.EAGAIN:
		return 0, errNothingYet
	case errno != 0:
		return 0, &net.OpError{Op: "read", Net: "unix", Err: os.NewSyscallError("read", errno)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *rawConn) Write(p []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			r, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[n])), uintptr(len(p)-n))
			switch e {
			case 0:
				n += int(r)
			case unix.EINTR:
			case unix.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, &net.OpError{Op: "write", Net: "unix", Err: os.NewSyscallError("write", errno)}
	}
	return n, nil
}

// link is what the two directions of a forwarded connection share.
type link struct {
	last   atomic.Int64   // unix nanoseconds of the last byte either way, with an idle cut
	ended  [2]atomic.Bool // a direction's EOF, from the snippet (0) or the host (1)
	cut    func()         // closes both ends at once
	cutOff atomic.Bool    // cut was called
}

// touch records a byte either way now.
func (l *link) touch() { l.last.Store(time.Now().UnixNano()) }

// wakeWait is how long a standby's wake byte waits for the snippet's first
// bytes, to go with them.
const wakeWait = 2 * time.Millisecond

// readNow reads what src holds already, without waiting, in one read(2):
// ok is false if it holds nothing yet (or cannot be read so), and src is
// to be read as usual.
func readNow(src net.Conn, p []byte) (n int, err error, ok bool) {
	rc, isRaw := src.(*rawConn)
	if !isRaw || len(p) == 0 {
		return 0, nil, false
	}
	n, err = rc.read(p, false)
	if errors.Is(err, errNothingYet) {
		return 0, nil, false
	}
	return n, err, true
}

// copy copies r, src's bytes, to dst (out: from the snippet) within the
// limits, as frames if framed, the wake byte first if wake (with the first
// bytes read within wakeWait, or alone), and calls then, if not nil, after
// its first write.
func (c *callback) copy(dst, src net.Conn, r io.Reader, framed bool, l *link, out, wake bool, then func()) {
	off := 1 // room for the wake byte
	if framed {
		off += wire.CallbackHeader
	}
	buf := make([]byte, off+32<<10)
	for {
		var n int
		var err error
		ready := false
		if wake {
			// The snippet has usually written its first bytes by now:
			// then no deadline (no clock read: in gVisor, a system call).
			n, err, ready = readNow(src, buf[off:])
		}
		if !ready {
			var deadline time.Time // none
			if c.idle > 0 {
				deadline = time.Unix(0, l.last.Load()).Add(c.idle)
			}
			if wake {
				deadline = time.Now().Add(wakeWait)
			}
			src.SetReadDeadline(deadline)
			n, err = r.Read(buf[off:])
		}
		if wake && n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			err = nil // the snippet waits for the server to speak first
		}
		if n > 0 {
			if c.idle > 0 {
				l.touch()
			}
			if over := c.spend(int64(n)); over > 0 {
				n -= int(over)
				err = errOverLimit
			}
			c.count(int64(n), out)
		}
		if n > 0 || wake {
			start := off
			if framed && n > 0 {
				start -= wire.CallbackHeader
				wire.PutCallbackHeader(buf[start:], n)
			}
			if wake {
				start--
				buf[start] = wire.CallbackWake
				wake = false
			}
			// A side that stops reading is idle too: its write is cut.
			dst.SetWriteDeadline(c.writeDeadline())
			if _, werr := dst.Write(buf[start : off+n]); werr != nil {
				l.cut()
				return
			}
			if then != nil {
				then()
				then = nil
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			if c.idle == 0 || time.Since(time.Unix(0, l.last.Load())) < c.idle {
				continue // the other direction carried bytes
			}
			l.cut()
			return
		case errors.Is(err, io.EOF):
			dir := 1
			if out {
				dir = 0
			}
			l.ended[dir].Store(true)
			if framed {
				dst.SetWriteDeadline(c.writeDeadline())
				if _, werr := dst.Write([]byte{wire.CallbackEnd}); werr != nil {
					l.cut()
				}
				return
			}
			if l.ended[1-dir].Load() {
				return // forward closes both
			}
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			return
		default:
			l.cut()
			return
		}
	}
}

var errOverLimit = errors.New("over the callback byte limit")

// spend counts n more bytes of the call's and returns how many of them are
// over its budget (0 to n).
func (c *callback) spend(n int64) (over int64) {
	spent := c.spent.Add(n)
	return min(n, max(0, spent-c.bytes))
}

// writeDeadline is the deadline of a write to one side of a connection:
// none without an idle cut.
func (c *callback) writeDeadline() time.Time {
	if c.idle == 0 {
		return time.Time{}
	}
	return time.Now().Add(c.idle)
}

func (c *callback) count(n int64, out bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if out {
		c.stats.BytesOut += n
	} else {
		c.stats.BytesIn += n
	}
}

// close ends the call's callbacks: the socket is removed, every connection
// closed; it returns their counts.
func (c *callback) close() *wire.CallbackStats {
	c.ln.Close()       // removes the socket file
	c.accepting.Wait() // no event is sent from here on
	c.mu.Lock()
	c.closed = true
	for id, conn := range c.pending {
		delete(c.pending, id)
		conn.Close()
		c.stats.Refused++
	}
	for conn := range c.open {
		conn.Close()
	}
	for _, host := range c.standby {
		host.conn.Close()
	}
	c.standby = nil
	c.mu.Unlock()
	c.wg.Wait()
	c.a.cbMu.Lock()
	delete(c.a.callbacks, c.id)
	c.a.cbMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	stats := c.stats
	return &stats
}
