package egress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/internal/procmem"
)

// ResolverName is the resolver binary's file name (cmd/flmbox-resolver).
const ResolverName = "flmbox-resolver"

// resolverStart bounds the wait for a new resolver to listen.
const resolverStart = 10 * time.Second

// Resolver is the files of one sandbox's resolver process, all in the
// sandbox's directory.
type Resolver struct {
	// Config is its configuration (ResolverConfig, JSON), for people: the
	// resolver reads it on its standard input, and is known by its path
	// in its command line.
	Config string
	// Log is where it writes what goes wrong.
	Log string
	// Dir is the only directory it writes (ResolverConfig.Refused), owned
	// by ResolverUID.
	Dir string
	// Pid is where Start notes its process ID, for Running.
	Pid string
	// Cgroup names its cgroups (one per controller under cgroup v1), made
	// by Start and removed by Stop; none if empty.
	Cgroup string
}

// ResolverUser is the user a resolver runs as, a system user of its own
// (not "nobody", whom any process of that user could signal), made by the
// first Start that finds none, as dockerd makes dockremap. The resolver
// parses what code in the sandbox sends, and a flaw in that must not give
// the host's root away.
const ResolverUser = "flmbox-resolver"

var resolverIDs struct {
	sync.Mutex
	uid, gid int
}

// ResolverIDs returns the uid and gid of ResolverUser, making the user (a
// system user with no home and no shell) if there is none.
func ResolverIDs() (uid, gid int, err error) {
	resolverIDs.Lock()
	defer resolverIDs.Unlock()
	if resolverIDs.uid > 0 {
		return resolverIDs.uid, resolverIDs.gid, nil
	}
	u, err := user.Lookup(ResolverUser)
	if _, ok := err.(user.UnknownUserError); ok {
		out, aerr := exec.Command("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
			"--shell", "/usr/sbin/nologin", "--comment", "flmbox egress resolver", ResolverUser).CombinedOutput()
		if u, err = user.Lookup(ResolverUser); err != nil { // another flmbox may have made it meanwhile
			return 0, 0, fmt.Errorf("make user %s for egress resolvers: %v: %s", ResolverUser, aerr, bytes.TrimSpace(out))
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("look up user %s: %w", ResolverUser, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil || uid <= 0 || gid <= 0 {
		return 0, 0, fmt.Errorf("user %s: uid %s, gid %s: not a user of its own", ResolverUser, u.Uid, u.Gid)
	}
	resolverIDs.uid, resolverIDs.gid = uid, gid
	return uid, gid, nil
}

// Resolvers' cgroups bound each resolver (both its processes) to
// resolverMemory bytes and resolverPids tasks: a sandbox cannot grow its
// resolver into the host's memory or task table.
const (
	resolverMemory = 64 << 20
	resolverPids   = 64
)

// Start writes cfg and starts the resolver serving it, as ResolverUser, in
// a session of its own (no signal of its starter's terminal reaches it),
// in its cgroups: the guard in the router's namespace (with CAP_NET_ADMIN),
// the DNS part in this one, with the two sockets on the gateway's port 53
// that Start makes in the router (marked ResolverMark), and a channel
// between them. It returns once the resolver answers; a resolver that does
// not is killed.
func (r Resolver) Start(ctx context.Context, bin string, cfg ResolverConfig) (err error) {
	cfg.Host = hostAddrs()
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	fail := func(err error) error { return fmt.Errorf("start the sandbox's resolver: %w", err) }
	if err := atomicfile.WriteFile(r.Config, b, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Mkdir(r.Dir, 0o700); err != nil && !os.IsExist(err) {
		return fail(err)
	}
	uid, gid, err := ResolverIDs()
	if err != nil {
		return fail(err)
	}
	if err := os.Chown(r.Dir, uid, gid); err != nil {
		return fail(err)
	}
	dir, err := os.Open(r.Dir)
	if err != nil {
		return fail(err)
	}
	defer dir.Close()
	logf, err := os.OpenFile(r.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	defer logf.Close()
	// The binary is run from a descriptor: ResolverUser need not reach the
	// directory it is installed in.
	exe, err := os.Open(bin)
	if err != nil {
		return fail(err)
	}
	defer exe.Close()
	rt, err := openRouter()
	if err != nil {
		return fail(err)
	}
	defer rt.Close()
	udp, tcp, err := listenDNS(rt, cfg.Gateway)
	if err != nil {
		return fail(err)
	}
	defer udp.Close()
	defer tcp.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	guardPins, dnsPins := os.NewFile(uintptr(fds[0]), "pins"), os.NewFile(uintptr(fds[1]), "pins")
	defer guardPins.Close()
	defer dnsPins.Close()
	cgroups, err := makeCgroups(r.Cgroup)
	if err != nil {
		return fail(err)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	// Each reads its configuration once it is in its cgroups: before, it
	// does nothing.
	var configs []*os.File
	defer func() {
		for _, f := range configs {
			f.Close()
		}
	}()
	command := func(args []string, files []*os.File, caps []uintptr) (*exec.Cmd, error) {
		stdin, config, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		configs = append(configs, config)
		cmd := exec.Command("/proc/self/fd/4", args[1:]...)
		cmd.Args[0] = args[0]
		cmd.Stdin, cmd.Stderr, cmd.ExtraFiles = stdin, logf, files
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: cred, AmbientCaps: caps}
		return cmd, nil
	}
	guard, err := command([]string{bin, r.Config}, []*os.File{guardPins, exe}, []uintptr{unix.CAP_NET_ADMIN})
	if err != nil {
		return fail(err)
	}
	dns, err := command([]string{bin, r.Config, DNSPartArg}, []*os.File{dir, exe, udp, tcp, dnsPins}, nil)
	if err != nil {
		return fail(err)
	}
	out, err := guard.StdoutPipe()
	if err != nil {
		return err
	}
	// The guard is started from a thread in the router's namespace,
	// which it inherits; the DNS part stays in this one.
	if err := rt.do(guard.Start); err != nil {
		return fail(err)
	}
	go guard.Wait() // reaped here if its starter lives on; by init if not
	defer func() {
		if err != nil {
			guard.Process.Kill()
		}
	}()
	if err := dns.Start(); err != nil {
		return fail(err)
	}
	go dns.Wait()
	defer func() {
		if err != nil {
			dns.Process.Kill()
		}
	}()
	for _, f := range []*os.File{guard.Stdin.(*os.File), dns.Stdin.(*os.File)} {
		f.Close()
	}
	if err := atomicfile.WriteFile(r.Pid, []byte(strconv.Itoa(guard.Process.Pid)), 0o600); err != nil {
		return fail(err)
	}
	for _, p := range []*os.Process{guard.Process, dns.Process} {
		if err := joinCgroups(cgroups, p.Pid); err != nil {
			return fail(err)
		}
	}
	for _, f := range configs {
		if _, err := f.Write(b); err != nil {
			return fail(err)
		}
		f.Close()
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
	}()
	t := time.NewTimer(resolverStart)
	defer t.Stop()
	select {
	case err := <-ready:
		if err != nil {
			b, _ := os.ReadFile(r.Log)
			return fmt.Errorf("start the sandbox's resolver: %v: %s", err, lastWords(b))
		}
		return nil
	case <-t.C:
		return fmt.Errorf("start the sandbox's resolver: not listening after %v", resolverStart)
	case <-ctx.Done():
		return fail(ctx.Err())
	}
}

// dnsReadBuffer is the receive buffer of a resolver's UDP socket.
const dnsReadBuffer = 4 << 20

// listenDNS makes, in the router, the resolver's UDP and TCP sockets on
// gw's port 53, marked ResolverMark (the table lets DNS reach only those).
func listenDNS(rt *router, gw netip.Addr) (udp, tcp *os.File, err error) {
	err = rt.do(func() error {
		addr := netip.AddrPortFrom(gw, 53).String()
		lc := net.ListenConfig{Control: markSocket}
		pc, err := lc.ListenPacket(context.Background(), "udp4", addr)
		if err != nil {
			return err
		}
		defer pc.Close()
		// Room for a burst of questions while the DNS part works through
		// them (the default, 208 KiB, holds about 270 small datagrams):
		// over the host's rmem_max, as root may.
		if rc, err := pc.(*net.UDPConn).SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, dnsReadBuffer) })
		}
		l, err := lc.Listen(context.Background(), "tcp4", addr)
		if err != nil {
			return err
		}
		defer l.Close()
		if udp, err = pc.(*net.UDPConn).File(); err != nil {
			return err
		}
		tcp, err = l.(*net.TCPListener).File()
		return err
	})
	if err != nil && udp != nil {
		udp.Close()
	}
	return udp, tcp, err
}

// lastWords are the last line of a resolver's log, and the line before
// if its DNS part wrote it (the guard's last line then says that part
// ended; that part's says why).
func lastWords(b []byte) string {
	lines := strings.Split(string(bytes.TrimSpace(b)), "\n")
	last := lines[len(lines)-1]
	if len(lines) > 1 && strings.HasPrefix(lines[len(lines)-2], DNSPartName+": ") {
		return lines[len(lines)-2] + "; " + last
	}
	return last
}

// Running reports whether the resolver Start started last is running
// (cheaply: its pid's command line, not a scan of every process).
func (r Resolver) Running() bool {
	_, ok := r.pid()
	return ok
}

// pid is the process its pid file names, if that process is this
// resolver (a zombie, its command line gone, is not).
func (r Resolver) pid() (int, bool) {
	b, err := os.ReadFile(r.Pid)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	return pid, err == nil && pid > 1 && r.alive(pid)
}

// alive reports whether pid is this resolver, running.
func (r Resolver) alive(pid int) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && r.is(strings.Split(string(bytes.TrimSuffix(cmdline, []byte{0})), "\x00"))
}

// is reports whether a process whose command line is cmdline is this
// resolver.
func (r Resolver) is(cmdline []string) bool {
	return (len(cmdline) == 2 || len(cmdline) == 3 && cmdline[2] == DNSPartArg) &&
		filepath.Base(cmdline[0]) == ResolverName && cmdline[1] == r.Config
}

// Stop kills the resolver, both its parts, and waits until they are gone:
// every process of its cgroups, which it then removes; else (no cgroups)
// the process its pid file names, if that is it, and every process that
// serves its configuration, found by their command line (its DNS part, or
// a resolver whose starter was killed before it wrote the pid file).
func (r Resolver) Stop() error {
	if dirs, _ := cgroupDirs(r.Cgroup); dirs != nil {
		if err := killCgroups(r.Cgroup); err != nil {
			return fmt.Errorf("stop the sandbox's resolver: %w", err)
		}
	}
	if pid, ok := r.pid(); ok {
		syscall.Kill(pid, syscall.SIGKILL)
		for deadline := time.Now().Add(5 * time.Second); r.alive(pid); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("stop the sandbox's resolver: process %d still runs", pid)
			}
		}
	}
	if err := os.Remove(r.Pid); err != nil && !os.IsNotExist(err) {
		return err
	}
	if dirs, _ := cgroupDirs(r.Cgroup); dirs != nil {
		return nil // its cgroups held every process it had
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		pids, err := procmem.Matching(r.is)
		if err != nil {
			return fmt.Errorf("stop the sandbox's resolver: %w", err)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stop the sandbox's resolver: processes %v still run", pids)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
