package snippet

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Users.
//
// In a sandbox everything a snippet runs runs as one user, and a process
// may signal, trace or read the memory of any other process of its own
// user: one `kill -9 -1`, `os.kill(1, signal.SIGSTOP)` or ptrace attach
// would end or wedge the agent, and with it the sandbox and its /tmp. So
// the agent runs as root (uid 0 of gVisor's user namespace: nothing on the
// host) with only the capabilities it needs (flmbox's spec: CAP_KILL,
// CAP_SETUID, CAP_SETGID, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SYS_RESOURCE, and
// no new privileges), and snippets run as Agent.User (65534 in flmbox's
// sandboxes):
//
//   - Python processes (the zygote, its children, python3 spares) start as
//     root, wait for their code as root, and become User in the bootstrap
//     right after reading the gate, before any of the snippet's code runs
//     (setgroups, setgid, setuid: every uid is User's, so no capability
//     is left). While they wait, no snippet can signal or trace them. Until
//     then nothing a snippet can write takes part in their start: the agent
//     starts them with PYTHONPATH renamed FLMBOX_PYTHONPATH (which would
//     otherwise put /tmp/site-packages before the standard library at the
//     interpreter's own start, e.g. for the encodings module) and
//     PYTHONUSERBASE under /proc (so that site finds no user site under
//     HOME=/tmp: see pythonEnv), and the bootstrap puts both back for the
//     snippet, then does what site does for the user site (see
//     pythonSiteDef).
//   - Shell processes are exec'd as User (the shell cannot change its
//     user). A shell spare can therefore be reached by the snippets that
//     run while it waits: one that met some snippet's code (one started or
//     ended since it started, or one was running then) is used only if it
//     is neither stopped nor traced (spareUsable; a killed one has exited);
//     otherwise it is killed and a new process started. What a snippet
//     could do to it beyond that (trace it, change its memory, let it go)
//     is what it can do to the next calls of its sandbox anyway, through
//     /tmp: calls of one sandbox are one trust domain, and a reset kills
//     the spares.
//   - The agent's socket directory is root's, mode 0700: User cannot reach
//     the socket by its path, /proc/1/fd (the agent is root's and not
//     dumpable) or any other way, so only the host speaks to the agent.
//   - The agent removes User's System V IPC objects at a reset with its
//     effective uid switched to User on one locked thread, which then ends
//     (removal needs the owner's uid or CAP_SYS_ADMIN, which it does not
//     have).
//
// RLIMIT_NPROC counts User's processes only: the agent's own threads and
// its waiting spares do not take from the snippets' limit.

// User is a user and group ID that snippets run as.
type User struct {
	UID, GID uint32
}

// ParseUser parses "UID:GID".
func ParseUser(s string) (*User, error) {
	var u User
	if _, err := fmt.Sscanf(s, "%d:%d", &u.UID, &u.GID); err != nil || fmt.Sprintf("%d:%d", u.UID, u.GID) != s {
		return nil, fmt.Errorf("user %q: want UID:GID", s)
	}
	return &u, nil
}

// credential is what os/exec needs to start a process as u; nil for the
// agent's own user.
func (u *User) credential() *syscall.Credential {
	if u == nil {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
}

// python is u as the argument of the Python bootstrap: None or (uid, gid).
func (u *User) python() string {
	if u == nil {
		return "None"
	}
	return fmt.Sprintf("(%d, %d)", u.UID, u.GID)
}

// pythonPathVar is the name PYTHONPATH takes in the environment of the
// Python processes that the agent starts, until their bootstrap.
const pythonPathVar = "FLMBOX_PYTHONPATH"

// userBaseVar keeps PYTHONUSERBASE's value in the environment of the Python
// processes that the agent starts, until their bootstrap; without it,
// PYTHONUSERBASE was not set.
const userBaseVar = "FLMBOX_PYTHONUSERBASE"

// noUserBase is PYTHONUSERBASE while the agent's Python processes start: a
// path under /proc, where nobody can make a directory, so that the user
// site (noUserBase/lib/pythonX.Y/site-packages) is never found then.
const noUserBase = "/proc/flmbox-no-user-base"

// pythonEnv returns env for a Python process of the agent: PYTHONPATH
// renamed pythonPathVar, and PYTHONUSERBASE set to noUserBase with its
// value, if env set it, kept as userBaseVar (any pythonPathVar or
// userBaseVar of env's own dropped). Its bootstrap puts them back.
func pythonEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, pythonPathVar+"="), strings.HasPrefix(kv, userBaseVar+"="):
		case strings.HasPrefix(kv, "PYTHONPATH="):
			out = append(out, pythonPathVar+kv[len("PYTHONPATH"):])
		case strings.HasPrefix(kv, "PYTHONUSERBASE="):
			out = append(out, userBaseVar+kv[len("PYTHONUSERBASE"):])
		default:
			out = append(out, kv)
		}
	}
	return append(out, "PYTHONUSERBASE="+noUserBase)
}

// reachable says whether a spare of lang is a process of the snippets'
// own user that flmbox guards: a shell's, when snippets run as another user
// than the agent (Python processes wait as the agent's user). Without User,
// every process is the snippets' user, the agent's too, and nothing is
// guarded.
func (a *Agent) reachable(lang string) bool {
	return a.User != nil && lang == wire.LanguageShell
}

// codeStarted and codeEnded count a snippet's code starting and ending.
func (a *Agent) codeStarted() {
	a.running.Add(1)
	a.codeRuns.Add(1)
}

func (a *Agent) codeEnded() {
	a.codeRuns.Add(1)
	a.running.Add(-1)
}

// spareMark is what a starting spare records of the snippets around it:
// the count of code starts and ends, and whether it started when no
// snippet ran and no stray could be left (the last sweep done).
func (a *Agent) spareMark() (runs int64, idle bool) {
	runs = a.codeRuns.Load()
	return runs, a.running.Load() == 0 && !(a.sweeps && a.leftovers.Load())
}

// spareUsable says whether spare p may run a call: a spare that snippets can
// reach and that met some snippet's code must be neither stopped nor traced
// (a killed one has exited, which takeSpare checks).
func (a *Agent) spareUsable(p *proc) bool {
	if !a.reachable(p.lang) || p.idleStart && p.runs == a.codeRuns.Load() {
		return true
	}
	return runnable(p.pid)
}

// runnable says whether process pid is neither stopped nor traced, from
// /proc/PID/status.
func runnable(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			if strings.HasPrefix(v, "T") || strings.HasPrefix(v, "t") {
				return false
			}
		case "TracerPid":
			if v != "0" {
				return false
			}
		}
	}
	return true
}

// asUser runs f on a thread of its own whose effective uid is u's, and
// lets that thread end afterwards: no other goroutine ever runs with it.
func asUser(u *User, f func() error) error {
	if u == nil {
		return f()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		// The raw system call changes this thread's credentials only (Go's
		// syscall.Setresuid changes every thread's).
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(u.UID), ^uintptr(0)); errno != 0 {
			done <- fmt.Errorf("switch to user %d: %w", u.UID, errno)
			return
		}
		done <- f()
	}()
	return <-done
}
