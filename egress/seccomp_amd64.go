//go:build linux && amd64

package egress

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// confineParser confines the calling process, the resolver's DNS part, for
// the rest of its life and its every thread: no new privileges (execve
// cannot gain any), and a seccomp filter that lets through only
// parserSyscalls, socket for IPv4 and IPv6 only (no netlink: nftables and
// routes are the other part's), and tgkill to itself; any other call fails
// with EPERM, a call of another architecture kills it.
func confineParser() error {
	// no_new_privs is set on this thread, the filter on every thread:
	// with TSYNC the kernel sets no_new_privs on the others too.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	prog := parserFilter(uint32(os.Getpid()))
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		return fmt.Errorf("install the seccomp filter: %w", e)
	}
	if r != 0 {
		return fmt.Errorf("install the seccomp filter: thread %d could not take it", r)
	}
	return nil
}

// Offsets in struct seccomp_data.
const (
	seccompNr   = 0
	seccompArg  = 4
	seccompArg0 = 16 // the low half on a little-endian machine
)

// parserFilter assembles the filter of confineParser for process pid.
func parserFilter(pid uint32) []unix.SockFilter {
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	// The tail, jumped to forward: [refuse, allow, kill, nosys].
	var body []unix.SockFilter
	// Jumps are written as distances to the tail's entries, fixed up once
	// the body's length is known: toRefuse, toAllow, toKill mark them.
	type fix struct {
		at     int
		jt, jf int // -1: no jump; 0, 1, 2: refuse, allow, kill
	}
	var fixes []fix
	add := func(code uint16, k uint32, jt, jf int) {
		fixes = append(fixes, fix{len(body), jt, jf})
		body = append(body, unix.SockFilter{Code: code, K: k})
	}
	const none, refuse, allow, kill, nosys = -1, 0, 1, 2, 3
	add(ld, seccompArg, none, none)
	add(jeq, seccompArch, none, kill)
	add(ld, seccompNr, none, none)
	add(jge, x32Bit, refuse, none)
	// tgkill(tgid, ...) to itself only (the runtime's preemption).
	add(jeq, unix.SYS_TGKILL, none, none)
	tgkill := len(body) - 1
	add(ld, seccompArg0, none, none)
	add(jeq, pid, allow, refuse)
	body[tgkill].Jf = 2
	// clone3 is "not implemented": its flags are in memory, out of the
	// filter's reach, and glibc (a cgo build's threads) falls back to clone
	// on ENOSYS only.
	add(jeq, unix.SYS_CLONE3, nosys, none)
	// clone(flags, ...) makes threads only: no process, no namespace.
	add(jeq, unix.SYS_CLONE, none, none)
	clone := len(body) - 1
	add(ld, seccompArg0, none, none)
	add(jset, unix.CLONE_NEWNS|unix.CLONE_NEWUTS|unix.CLONE_NEWIPC|unix.CLONE_NEWUSER|unix.CLONE_NEWPID|
		unix.CLONE_NEWNET|unix.CLONE_NEWCGROUP, refuse, none)
	add(jset, unix.CLONE_THREAD, allow, refuse)
	body[clone].Jf = 3
	// socket(domain, ...) for AF_INET and AF_INET6 only.
	add(jeq, unix.SYS_SOCKET, none, none)
	socket := len(body) - 1
	add(ld, seccompArg0, none, none)
	add(jeq, unix.AF_INET, allow, none)
	add(jeq, unix.AF_INET6, allow, refuse)
	body[socket].Jf = 3
	for _, nr := range parserSyscalls {
		add(jeq, nr, allow, none)
	}
	n := len(body)
	errno := uint32(unix.EPERM)
	body = append(body,
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | errno},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_KILL_PROCESS},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)})
	if len(body) > 255 {
		panic("seccomp filter: a jump too far")
	}
	for _, f := range fixes {
		if f.jt != none {
			body[f.at].Jt = uint8(n + f.jt - f.at - 1)
		}
		if f.jf != none {
			body[f.at].Jf = uint8(n + f.jf - f.at - 1)
		}
	}
	return body
}
