package egress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
}

// ResolverUID is the user a resolver runs as, with no capability but
// CAP_NET_BIND_SERVICE (port 53) and CAP_NET_ADMIN (its sandbox's table):
// it parses what code in the sandbox sends, and a flaw in that must not
// give the host's root away.
const ResolverUID = 65534

// Start writes cfg and starts bin serving it, as ResolverUID, in a session
// of its own (no signal of its starter's terminal reaches it), and returns
// once it listens. A resolver that does not listen is killed.
func (r Resolver) Start(ctx context.Context, bin string, cfg ResolverConfig) (err error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(r.Config, b, 0o600); err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	if err := os.Mkdir(r.Dir, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	if err := os.Chown(r.Dir, ResolverUID, ResolverUID); err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	dir, err := os.Open(r.Dir)
	if err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	defer dir.Close()
	logf, err := os.OpenFile(r.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	defer logf.Close()
	// The binary is run from a descriptor: ResolverUID need not reach the
	// directory it is installed in.
	exe, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	defer exe.Close()
	cmd := exec.Command("/proc/self/fd/4", r.Config)
	cmd.Args[0] = bin
	cmd.Stdin, cmd.Stderr, cmd.ExtraFiles = bytes.NewReader(b), logf, []*os.File{dir, exe}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true,
		Credential:  &syscall.Credential{Uid: ResolverUID, Gid: ResolverUID, NoSetGroups: false},
		AmbientCaps: []uintptr{unix.CAP_NET_BIND_SERVICE, unix.CAP_NET_ADMIN}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
	}
	go cmd.Wait() // reaped here if its starter lives on; by init if not
	defer func() {
		if err != nil {
			cmd.Process.Kill()
		}
	}()
	if err := atomicfile.WriteFile(r.Pid, []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		return fmt.Errorf("start the sandbox's resolver: %w", err)
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
			return fmt.Errorf("start the sandbox's resolver: %v: %s", err, lastLine(b))
		}
		return nil
	case <-t.C:
		return fmt.Errorf("start the sandbox's resolver: not listening after %v", resolverStart)
	case <-ctx.Done():
		return fmt.Errorf("start the sandbox's resolver: %w", ctx.Err())
	}
}

func lastLine(b []byte) string {
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return string(b)
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
	return len(cmdline) == 2 && filepath.Base(cmdline[0]) == ResolverName && cmdline[1] == r.Config
}

// Stop kills the resolver and waits until it is gone: the process its pid
// file names, if that is it; else every process that serves its
// configuration, found by their command line (a starter killed before it
// wrote the pid file).
func (r Resolver) Stop() error {
	if pid, ok := r.pid(); ok {
		syscall.Kill(pid, syscall.SIGKILL)
		for deadline := time.Now().Add(5 * time.Second); r.alive(pid); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("stop the sandbox's resolver: process %d still runs", pid)
			}
		}
		return os.Remove(r.Pid)
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
