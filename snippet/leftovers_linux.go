package snippet

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// What the sandbox's kernel keeps of snippets once their processes are gone.
//
// A reset (Reset) kills every process and empties the directories the
// snippets can write; what is left is what gVisor's kernel holds for the
// whole sandbox, with no process or file behind it: System V IPC objects,
// POSIX message queues, keyrings, and sockets that no process holds. The
// agent, as PID 1, removes the first two, keeps snippets from making the
// third, and fails a reset that finds one of the last two (see "What a
// sandbox can hold, and how a reset clears it" in docs/ARCHITECTURE.md).

// maxIPCScan bounds the identifiers removeSysvIPC goes through at a reset:
// a sandbox whose snippets made more objects of a kind since the last reset
// is not reset (and gets replaced).
const maxIPCScan = 1 << 16

// sysvKinds are the System V IPC objects a reset removes: how to make one
// (its identifier is then the highest) and how to remove one.
var sysvKinds = [...]struct {
	name string
	get  func() (uintptr, unix.Errno)
	rm   func(id uintptr)
}{
	{"shared memory segment", func() (uintptr, unix.Errno) {
		r, _, e := unix.Syscall(unix.SYS_SHMGET, ipcPrivate, 4096, 0o600)
		return r, e
	}, func(id uintptr) { unix.Syscall(unix.SYS_SHMCTL, id, ipcRMID, 0) }},
	{"semaphore set", func() (uintptr, unix.Errno) {
		r, _, e := unix.Syscall(unix.SYS_SEMGET, ipcPrivate, 1, 0o600)
		return r, e
	}, func(id uintptr) { unix.Syscall6(unix.SYS_SEMCTL, id, 0, ipcRMID, 0, 0, 0) }},
	{"message queue", func() (uintptr, unix.Errno) {
		r, _, e := unix.Syscall(unix.SYS_MSGGET, ipcPrivate, 0o600, 0)
		return r, e
	}, func(id uintptr) { unix.Syscall(unix.SYS_MSGCTL, id, ipcRMID, 0) }},
}

const ipcRMID, ipcPrivate = 0, 0

// sysvScanned is, for each of sysvKinds, the first identifier the next
// reset's removeSysvIPC goes through: every object below it was removed by
// an earlier reset.
type sysvScanned [len(sysvKinds)]uintptr

// removeSysvIPC removes every System V shared memory segment, semaphore set
// and message queue that snippets made since the last reset. gVisor gives
// out identifiers in increasing order (wrapping only past 2^31) and does not
// list them (its SHM_INFO and MSG_INFO do not give the highest one), so it
// makes a new object of each kind, whose identifier is the highest, and
// removes every identifier from the first one the last reset did not go
// through (next) up to it; next then moves past it. Without next, each reset
// would go through every identifier the sandbox ever gave out: its N-th
// reset some 3N system calls, and none past maxIPCScan.
func removeSysvIPC(next *sysvScanned) error {
	for i, k := range sysvKinds {
		highest, errno := k.get()
		if errno != 0 {
			return fmt.Errorf("reset: make a System V %s: %w", k.name, errno)
		}
		switch {
		case highest < next[i]:
			k.rm(highest)
			return fmt.Errorf("reset: System V %s identifiers wrapped around: the sandbox used too many to clear", k.name)
		case highest-next[i] > maxIPCScan:
			k.rm(highest)
			return fmt.Errorf("reset: System V %s identifiers reach %d since the last reset: the sandbox used too many to clear", k.name, highest)
		}
		for id := next[i]; id <= highest; id++ {
			k.rm(id)
		}
		next[i] = highest + 1
	}
	return nil
}

// POSIX message queues.
//
// A POSIX message queue (mq_open) outlives its processes, and only an mqueue
// filesystem lists them: flmbox's sandboxes mount none (runsc ignores an
// mqueue mount in the spec), and mounting one takes CAP_SYS_ADMIN, which the
// agent lacks. A process in a user namespace of its own holds every capability
// there, and gVisor lets it mount an mqueue filesystem in a mount namespace of
// that user namespace's: it mounts the queues of the mounting process's IPC
// namespace, the sandbox's (Linux would refuse). gVisor makes a new user
// namespace only for a process of one thread, which the agent is not, so at
// its first reset the agent starts its own binary as a helper (RunHelper,
// "mqueue-fork"), which starts it again in a new user namespace, where it is
// root, and a new mount namespace ("mqueue"); that one mounts the sandbox's
// mqueue filesystem, sends the agent its root directory, open, and exits. Two
// steps, because Go starts a process in a new user namespace with a real fork,
// not a vfork: a fork of the agent made gVisor copy its pages that the agent
// then wrote, 2 MiB at a time, which stayed in the sandbox's memory for good
// (docs/PERFORMANCE.md, "Memory of an idle sandbox"); the middle helper is a
// fresh small process whose fork costs little, and is gone at once. The agent
// keeps that directory: each reset reads the queues' names there and removes
// each with mq_unlink, which takes write access to that directory (mode 0555,
// root's): the agent's CAP_DAC_OVERRIDE. Snippets cannot remove even their own
// queues. Only the first reset starts the helper, a process start (its cost:
// docs/ARCHITECTURE.md, "What a sandbox can hold, and how a reset clears it");
// later resets read the directory.

// HelperArg, as the first argument of the program that runs an Agent as
// PID 1 (flmbox-agent), makes it a helper of the agent's reset: such a
// program must then call RunHelper with the arguments that follow and exit.
const HelperArg = "--flmbox-reset-helper"

// helperTimeout bounds the reset's helper.
const helperTimeout = 10 * time.Second

// RunHelper runs a helper of the agent's reset, in the program that runs
// the Agent (os.Executable), which the agent starts with HelperArg and args:
// "mqueue-fork DIR UID GID" runs "mqueue DIR" in a user namespace of its
// own (root there, UID:GID outside) and a mount namespace; "mqueue DIR" mounts the
// mqueue filesystem on DIR and sends its root, open, as an SCM_RIGHTS
// message on file descriptor 3.
func RunHelper(args []string) error {
	if len(args) > 0 && strings.HasPrefix(args[0], "copy-") {
		return copyHelper(args)
	}
	if len(args) == 4 && args[0] == "mqueue-fork" {
		return mqueueFork(args[1], args[2], args[3])
	}
	if len(args) != 2 || args[0] != "mqueue" {
		return fmt.Errorf("reset helper: want mqueue DIR or mqueue-fork DIR UID GID, got %q", args)
	}
	dir := args[1]
	if err := unix.Mount("mqueue", dir, "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("reset helper: mount an mqueue filesystem on %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reset helper: open %s: %w", dir, err)
	}
	if err := unix.Sendmsg(3, []byte{0}, unix.UnixRights(fd), nil, 0); err != nil {
		return fmt.Errorf("reset helper: send the mqueue filesystem: %w", err)
	}
	return nil
}

// mqueueFork runs, in the middle helper, the helper that mounts the mqueue
// filesystem on dir ("mqueue DIR") in a user namespace of its own, where
// it is root mapped to uid:gid, and a mount namespace of its own; that one
// gets file descriptor 3 and this program's stderr.
func mqueueFork(dir, uid, gid string) error {
	u, err1 := strconv.Atoi(uid)
	g, err2 := strconv.Atoi(gid)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("reset helper: mqueue-fork %s %s %s: want a numeric uid and gid", dir, uid, gid)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := &exec.Cmd{Path: exe, Args: []string{"flmbox-agent", HelperArg, "mqueue", dir}, Dir: "/", Env: []string{},
		ExtraFiles: []*os.File{os.NewFile(3, "agent")}, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: u, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: g, Size: 1}},
			Credential:  &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
			Pdeathsig:   syscall.SIGKILL, // a middle helper killed (it hung) takes it along
		}}
	return cmd.Run()
}

// removePosixMQueues removes every POSIX message queue of the sandbox.
func (a *Agent) removePosixMQueues() error {
	if a.mqueues == nil {
		d, err := openMQueues(a.dir, cmp.Or(a.User, &User{UID: 65534, GID: 65534}))
		if err != nil {
			return fmt.Errorf("reset: list POSIX message queues: %w", err)
		}
		a.mqueues = d
	}
	if _, err := a.mqueues.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("reset: list POSIX message queues: %w", err)
	}
	names, err := a.mqueues.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("reset: list POSIX message queues: %w", err)
	}
	for _, name := range names {
		p, err := unix.BytePtrFromString(name)
		if err != nil {
			return fmt.Errorf("reset: remove POSIX message queue %q: %w", name, err)
		}
		if _, _, errno := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 && errno != unix.ENOENT {
			return fmt.Errorf("reset: remove POSIX message queue %q: %w", name, errno)
		}
	}
	return nil
}

// openMQueues runs the helper, which mounts the sandbox's mqueue
// filesystem on dir in namespaces of its own, and returns the root it sends.
func openMQueues(dir string, user *User) (*os.File, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// The helper's exit closes its end, which ends the read; a helper that
	// hangs is killed.
	tv := unix.NsecToTimeval(helperTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fds[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "reset helper"), os.NewFile(uintptr(fds[1]), "reset helper")
	defer ours.Close()
	var stderr bytes.Buffer
	cmd := &exec.Cmd{Path: exe, Args: []string{"flmbox-agent", HelperArg, "mqueue-fork", dir, strconv.Itoa(int(user.UID)), strconv.Itoa(int(user.GID))},
		Dir: "/", Env: []string{}, ExtraFiles: []*os.File{theirs}, Stderr: &stderr}
	pid, err := startChild(cmd)
	theirs.Close()
	if err != nil {
		return nil, fmt.Errorf("start the helper %s: %w", exe, err)
	}
	waited := make(chan error, 1)
	go func() {
		waited <- cmd.Wait()
		forgetChild(pid)
	}()
	oob := make([]byte, unix.CmsgSpace(4))
	var oobn int
	var rerr error
	for {
		// With a receive timeout, a signal (the Go runtime's preemption)
		// interrupts the call instead of restarting it.
		if _, oobn, _, _, rerr = unix.Recvmsg(int(ours.Fd()), make([]byte, 1), oob, unix.MSG_CMSG_CLOEXEC); rerr != unix.EINTR {
			break
		}
	}
	var root *os.File
	if rerr == nil {
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
			if got, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(got) == 1 {
				root = os.NewFile(uintptr(got[0]), "mqueue")
			}
		}
	}
	if root == nil {
		cmd.Process.Kill() // if it still runs
	}
	werr := <-waited
	if root == nil || werr != nil {
		if root != nil {
			root.Close()
		}
		return nil, fmt.Errorf("the helper failed (%v, %v): %s", werr, rerr, bytes.TrimSpace(stderr.Bytes()))
	}
	return root, nil
}

// Keyrings.
//
// A keyring (keyctl's JOIN_SESSION_KEYRING, the only way gVisor makes one)
// outlives its processes: gVisor keeps every key of a user namespace until the
// namespace ends, lists none (no /proc/keys; serial numbers are random) and
// removes none (no KEYCTL_INVALIDATE, REVOKE or UNLINK), and one whose owner
// lets others search it is found by its name from any later call. So the
// agent, as PID 1, fills the sandbox's key set with anonymous keyrings of its
// own as soon as it starts (in the background, while its first spare starts; a
// call's snippet waits until it is done; its cost: docs/ARCHITECTURE.md, "What
// a sandbox can hold, and how a reset clears it"), and snippets get EDQUOT
// from keyctl, as they would get EPERM under Docker's default seccomp profile.
// A reset fills it again (one call while it stays full) and counts: a reset
// fails if the set holds keyrings that the agent did not make.

// maxKeyrings bounds the keyrings sealKeyrings makes: gVisor's key set
// holds 200 by default (/proc/sys/kernel/keys/maxkeys, which only the
// sandbox's CAP_SYS_ADMIN could raise).
const maxKeyrings = 1 << 12

// keyrings is the agent's account of the sandbox's key set.
type keyrings struct {
	done        chan struct{} // closed once the first filling ends; nil before it starts
	made        int           // keyrings the agent made
	unsupported bool          // keyctl fails with ENOSYS or EPERM: no keyring exists
	err         error         // why the first filling failed
}

// startSealingKeyrings fills the key set in the background.
func (a *Agent) startSealingKeyrings() {
	k := &a.keyrings
	k.done = make(chan struct{})
	go func() {
		defer close(k.done)
		k.made, k.unsupported, k.err = sealKeyrings()
	}()
}

// wait waits until the first filling has ended (a snippet must not run
// before: it could make a keyring), or ctx is done.
func (k *keyrings) wait(ctx context.Context) error {
	if k.done == nil {
		return nil
	}
	select {
	case <-k.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// checkKeyrings fills the key set, once the first filling has ended, and
// fails if it holds keyrings that the agent did not make.
func (a *Agent) checkKeyrings(ctx context.Context) error {
	k := &a.keyrings
	if err := k.wait(ctx); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	if k.err != nil {
		return fmt.Errorf("reset: %w", k.err)
	}
	made, unsupported, err := sealKeyrings()
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	k.made += made
	if unsupported || k.unsupported {
		return nil
	}
	b, err := os.ReadFile("/proc/sys/kernel/keys/maxkeys")
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	size, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("reset: read the key set's size: %w", err)
	}
	if others := size - k.made; others > 0 {
		return fmt.Errorf("reset: %d keyrings that snippets made outlive them (gVisor can neither list nor remove one); the sandbox cannot be made clean", others)
	}
	return nil
}

// sealKeyrings makes anonymous keyrings until the key set is full, on a
// thread that then ends, so that no process the agent starts has them as
// its session keyring; made is how many. unsupported: keyctl fails
// (ENOSYS, EPERM), so no snippet can make a keyring either.
func sealKeyrings() (made int, unsupported bool, err error) {
	_, err = onThreadOfItsOwn(func() (struct{}, error) {
		for range maxKeyrings {
			_, _, errno := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0)
			switch errno {
			case 0:
				made++
			case unix.EDQUOT:
				return struct{}{}, nil
			case unix.ENOSYS, unix.EPERM:
				unsupported = made == 0
				return struct{}{}, nil
			default:
				return struct{}{}, errno
			}
		}
		return struct{}{}, fmt.Errorf("the key set is not full after %d keyrings", maxKeyrings)
	})
	if err != nil {
		return made, false, fmt.Errorf("seal keyrings: %w", err)
	}
	return made, unsupported, nil
}

// onThreadOfItsOwn runs f on a thread locked to it that ends afterwards:
// what f changes of its thread (credentials, namespaces, session keyring)
// is never seen by another goroutine, nor by a process started from it.
func onThreadOfItsOwn[T any](f func() (T, error)) (T, error) {
	type answer struct {
		v   T
		err error
	}
	done := make(chan answer, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		v, err := f()
		done <- answer{v, err}
	}()
	a := <-done
	return a.v, a.err
}

// strandedWait is how long strandedSockets waits for sockets that no
// process holds to go (a closing connection of the agent's) before it
// reports them.
const strandedWait = time.Second

// checkStrandedSockets fails if the sandbox holds sockets that no process
// holds, as PID 1 once every other process is gone: every socket that
// netDir lists (gVisor lists every socket of the sandbox in /proc/net/unix,
// tcp and udp; not IPv6 ones) must be one of this process's descriptors
// (fdDir). Any other lives only in flight: a Unix socket's queue holds a
// descriptor (SCM_RIGHTS) of itself, a cycle that Linux's garbage collector
// frees and gVisor never does, and with it every descriptor in flight in
// it: a bound abstract name, a port, a memfd's memory. No process can reach
// them, nor can the agent close them: the sandbox cannot be made clean, and
// the reset fails (the pool and batch workers replace such a sandbox).
func checkStrandedSockets(netDir, fdDir string) error {
	deadline := time.Now().Add(strandedWait)
	for {
		stranded, err := strandedSockets(netDir, fdDir)
		if err != nil {
			return fmt.Errorf("reset: list sockets: %w", err)
		}
		if len(stranded) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reset: %d sockets are held by no process (a snippet left descriptors in flight in a cycle of Unix sockets, which gVisor never frees): %s; the sandbox cannot be made clean",
				len(stranded), strings.Join(stranded, ", "))
		}
		time.Sleep(time.Millisecond)
	}
}

// strandedSockets returns the sockets that netDir lists and that are not
// descriptors of this process (fdDir), described. It reads netDir first:
// a socket of the process's that closes in between is listed (and is gone
// on the next try), one that opens is not.
func strandedSockets(netDir, fdDir string) ([]string, error) {
	listed := map[uint64]string{}
	for _, f := range []struct {
		name       string
		inodeField int
		describe   func(fields []string) string
	}{
		// Num RefCount Protocol Flags Type St Inode [Path]
		{"unix", 6, func(f []string) string {
			if len(f) > 7 {
				return "unix " + f[7]
			}
			return "unix socket " + f[6]
		}},
		// sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode ...
		{"tcp", 9, inetSocket("tcp")},
		{"tcp6", 9, inetSocket("tcp6")},
		{"udp", 9, inetSocket("udp")},
		{"udp6", 9, inetSocket("udp6")},
	} {
		file, err := os.Open(filepath.Join(netDir, f.name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(file)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) <= f.inodeField {
				continue
			}
			ino, err := strconv.ParseUint(fields[f.inodeField], 10, 64)
			if err != nil {
				continue
			}
			listed[ino] = f.describe(fields)
		}
		err = sc.Err()
		file.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file.Name(), err)
		}
	}
	if len(listed) == 0 {
		return nil, nil
	}
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if s, ok := strings.CutPrefix(target, "socket:["); ok {
			if ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
				delete(listed, ino)
			}
		}
	}
	out := slices.Collect(maps.Values(listed))
	slices.Sort(out)
	return out, nil
}

// inetSocket describes a socket of /proc/net/tcp or udp by its local port.
func inetSocket(proto string) func([]string) string {
	return func(f []string) string {
		_, port, _ := strings.Cut(f[1], ":")
		if p, err := strconv.ParseUint(port, 16, 16); err == nil {
			return fmt.Sprintf("%s port %d", proto, p)
		}
		return proto + " socket " + f[9]
	}
}
