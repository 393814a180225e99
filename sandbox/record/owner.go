package record

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Process is a host process a record names: the process a sandbox belongs
// to (its Owner, sandbox.Spec.Ephemeral: once it is gone, nobody will
// remove the sandbox but Reconcile), or the sandbox's own gVisor sandbox
// process (its Process: once it is gone, so is the sandbox). A pid alone
// could be reused by another process, so the process's start time is kept
// with it; and a pid means nothing outside its pid namespace, so that is
// kept too.
type Process struct {
	PID int `json:"pid"`
	// Start is the process's start time, in clock ticks since boot (field
	// 22 of /proc/PID/stat).
	Start uint64 `json:"start"`
	// PIDNS is the inode of the pid namespace PID is in (0: unknown).
	PIDNS uint64 `json:"pidns,omitempty"`
}

// Owner is the process a sandbox belongs to (see Process).
type Owner = Process

// self is this process, read once: none of it changes.
var self = sync.OnceValues(func() (Process, error) {
	p, err := ProcessOf(os.Getpid())
	if err != nil {
		return Process{}, err
	}
	return *p, nil
})

// Self returns this process, as an owner.
func Self() (*Process, error) {
	o, err := self()
	if err != nil {
		return nil, err
	}
	return &o, nil
}

// ProcessOf returns process pid of this pid namespace, with its start time.
func ProcessOf(pid int) (*Process, error) {
	start, _, err := readStat(pid)
	if err != nil {
		return nil, fmt.Errorf("read the start time of process %d: %w", pid, err)
	}
	return &Process{PID: pid, Start: start, PIDNS: pidNamespace()}, nil
}

// Gone reports whether the process no longer exists: its pid has no
// /proc/PID/stat, or one of another process (another start time), or of a
// zombie (killed, not yet reaped: it will never remove anything). It is
// conservative: a nil Process (none recorded), a process in another pid
// namespace than this process's (or in one unknown), and any other failure
// to read /proc are not gone.
func (o *Process) Gone() bool {
	if o == nil || o.PID <= 0 {
		return false
	}
	if ns := pidNamespace(); ns == 0 || ns != o.PIDNS {
		return false // without /proc, a missing /proc/PID says nothing
	}
	start, state, err := readStat(o.PID)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return true
	}
	if err != nil {
		return false
	}
	return start != o.Start || state == 'Z' || state == 'X'
}

// readStat returns the start time (field 22) and state (field 3) of process
// pid from /proc/PID/stat. The fields are counted after the last ')': the
// command name (field 2) may hold spaces and parentheses.
func readStat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name: %q", pid, b)
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want at least 20", pid, len(f))
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return start, f[0][0], nil
}

// pidNamespace returns the inode of this process's pid namespace, 0 if it
// cannot be read; read once.
var pidNamespace = sync.OnceValue(func() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
})
