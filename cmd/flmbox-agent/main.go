// Command flmbox-agent is the resident agent of every flmbox sandbox, not a
// command for users: flmbox bind-mounts it read-only into each sandbox and
// starts it as the sandbox's first process, where it serves snippets on a
// Unix socket (snippet.Agent).
//
// It is a binary of its own, and small, because it starts in every new
// sandbox before the first snippet can: under gVisor each page of a binary
// that a process touches costs a fault, and flmbox-core (the whole CLI) as
// the agent made a new sandbox's first result measurably slower
// (docs/PERFORMANCE.md, "The agent's binary"). So it takes its flags with
// the standard library's flag package, and imports little besides the
// snippet package.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/snippet"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "flmbox-agent:", err)
		os.Exit(1)
	}
}

const usage = "usage: flmbox-agent --socket PATH [--limits JSON] [--memory-budget BYTES] [--inode-bytes BYTES] [--user UID:GID] [--callback-dir DIR] [--spares=true|false|lazy] [--meminfo FILE] [--cpus N] [--clean-dir DIR]..."

// dirs is a flag that may be given several times.
type dirs []string

func (d *dirs) String() string { return strings.Join(*d, ",") }

func (d *dirs) Set(v string) error {
	*d = append(*d, v)
	return nil
}

// spareMode is --spares: a boolean flag (--spares alone is true) that
// also takes lazy.
type spareMode string

const (
	sparesTrue  spareMode = "true"
	sparesFalse spareMode = "false"
	sparesLazy  spareMode = "lazy" // snippet.Agent.LazySpares
)

func (m *spareMode) String() string   { return string(*m) }
func (m *spareMode) IsBoolFlag() bool { return true }

func (m *spareMode) Set(v string) error {
	if v == string(sparesLazy) {
		*m = sparesLazy
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("want true, false or lazy")
	}
	*m = sparesFalse
	if b {
		*m = sparesTrue
	}
	return nil
}

func run(args []string) error {
	if len(args) > 0 && args[0] == snippet.HelperArg {
		return snippet.RunHelper(args[1:]) // started by the agent's reset
	}
	a, socket, err := parseArgs(args)
	if err != nil || a == nil {
		return err // no agent: -h
	}
	// Snippets must not be able to trace the agent or read its memory,
	// even when they run as its user (no --user).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the agent non-dumpable: %w", err)
	}
	// One P: the agent's goroutines wait on the snippet, and under gVisor
	// every scheduler handoff between threads is a costly futex; more Ps
	// only add spinning threads.
	goruntime.GOMAXPROCS(1)
	// Before any process starts: they inherit what they are shown.
	if err := a.ShowCPUs(); err != nil {
		return err
	}
	// The Python spare first: its interpreter's start is what a new
	// sandbox's first call waits for, and the rest overlaps it.
	a.StartSpares()
	a.Listen = func() (net.Listener, error) {
		_ = os.Remove(socket) // a socket left by an earlier agent, or before a checkpoint
		return net.Listen("unix", socket)
	}
	ln, err := a.Listen()
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.Serve(ctx, ln)
}

// parseArgs returns the agent that the command line asks for and the socket
// it is to listen on; with -h it prints the usage and returns no agent.
func parseArgs(args []string) (*snippet.Agent, string, error) {
	fs := flag.NewFlagSet("flmbox-agent", flag.ContinueOnError)
	socket := fs.String("socket", "", "Unix socket to listen on (required)")
	spares := sparesTrue
	fs.Var(&spares, "spares", "start each language's next snippet process ahead of time: true, false, or lazy (none before the first call of each language)")
	limits := fs.String("limits", "", "the limits of the first spare, as JSON (wire.Limits)")
	meminfo := fs.String("meminfo", "/proc/meminfo", "where the sandbox's memory use is read while snippets run; empty: no memory watch")
	budget := fs.Int64("memory-budget", 0, "the bytes that snippets and /tmp may use together (default: MemTotal)")
	user := fs.String("user", "", "UID:GID that snippets run as (default: the agent's own user); the agent then needs CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_SYS_RESOURCE")
	callbackDir := fs.String("callback-dir", "/dev/.flmbox/callbacks", "where calls' callback sockets are made (the agent's alone); empty: no callbacks")
	cpus := fs.Int("cpus", 0, "how many CPUs snippets are shown by their affinity (sched_getaffinity, nproc); 0: all")
	inodeBytes := fs.Int64("inode-bytes", 0, "what the memory watch counts for each inode used in the --clean-dir directories (default: nothing)")
	var clean dirs
	fs.Var(&clean, "clean-dir", "a directory that a reset empties (repeatable; default /tmp and /dev/shm)")
	fs.SetOutput(io.Discard) // errors are returned, and printed once
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Println(usage)
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
			return nil, "", nil
		}
		return nil, "", fmt.Errorf("%w; %s", err, usage)
	}
	if *socket == "" || fs.NArg() > 0 {
		return nil, "", errors.New(usage)
	}
	if len(clean) == 0 {
		clean = dirs{"/tmp", "/dev/shm"}
	}
	a := &snippet.Agent{Spares: spares != sparesFalse, LazySpares: spares == sparesLazy, CleanDirs: clean, MemInfo: *meminfo,
		MemoryBudget: *budget, InodeBytes: *inodeBytes, KillStrays: true, CallbackDir: *callbackDir, CPUs: *cpus}
	// The snippets start where the agent was started: the sandbox's
	// working directory (the image's WORKDIR, or /tmp).
	if dir, err := os.Getwd(); err == nil {
		a.WorkDir = dir
	}
	if *user != "" {
		u, err := snippet.ParseUser(*user)
		if err != nil {
			return nil, "", fmt.Errorf("--user: %w", err)
		}
		a.User = u
	}
	if *limits != "" {
		if err := json.Unmarshal([]byte(*limits), &a.SpareLimits); err != nil {
			return nil, "", fmt.Errorf("--limits: %w", err)
		}
	}
	return a, *socket, nil
}
