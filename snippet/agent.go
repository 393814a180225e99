package snippet

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Bounds of the conversation on one connection.
const (
	// maxRequestSize bounds what the agent reads of a request: the largest
	// code and env JSON-escaped (a control character takes 6 bytes), the
	// largest stdin in base64, and the rest.
	maxRequestSize = 6*(wire.MaxCodeSize+wire.MaxEnvSize) + (wire.MaxStdinSize+2)/3*4 + 64<<10
	// requestTimeout bounds the time a client takes to send its request.
	requestTimeout = 30 * time.Second
	// responseTimeout bounds the time a client takes to read the result.
	responseTimeout = 30 * time.Second
)

// Agent runs snippets for clients connecting on a Unix socket. flmbox starts
// it (flmbox-agent) as the first process of every sandbox; it is usable on
// any Linux host too, as the tests do.
//
// Each snippet is a new process: python3 or /bin/sh in its own process
// group, with stdin at EOF (/dev/null), the working directory Dir and the
// environment Env. Its stdout and stderr are captured separately with the
// request's caps, its rlimits are set before its code runs, and when it ends
// (or times out, or the call is cancelled) whatever is left of its process
// group is killed, so that a `sleep 1000 &` cannot outlive the call: at once
// on a timeout or a cancel, else after a grace (SIGTERM, then SIGKILL once
// none of the group holds its output pipes, a second later at most) that
// the answer does not wait for (see linger_linux.go). Processes
// that leave the group (setsid, daemons) are killed once no call is running
// with KillStrays, as in a sandbox; otherwise they are not tracked.
//
// The zero Agent is ready to use; its fields are read at the first Serve or
// Run and must not change after. An Agent must not be copied after first use.
type Agent struct {
	// Python is the Python interpreter: a path, or a name looked up in the
	// PATH of Env (default "python3"). A missing Python fails only Python
	// snippets.
	Python string
	// Shell is the shell that runs shell snippets with -c (default
	// "/bin/sh").
	Shell string
	// Dir is the snippets' writable directory, where code files are
	// written and copies land (default "/tmp").
	Dir string
	// WorkDir is the snippets' working directory (default Dir).
	WorkDir string
	// Env is the snippets' environment (default: the agent's own,
	// os.Environ(); in a sandbox that is the sandbox's environment).
	Env []string
	// CleanDirs are the directories that a reset empties (Request.Reset):
	// in a sandbox, /tmp and /dev/shm, the only places where the snippets'
	// user can write. A reset does not undo what a snippet did outside them
	// in a sandbox whose root is writable, nor what it did to the agent's
	// socket directory (flmbox makes it read-only once the agent listens).
	CleanDirs []string
	// Spares makes the agent start the process of the next snippet of each
	// language ahead of time, and fork Python processes from a zygote (see
	// spares_linux.go). Close kills them.
	Spares bool
	// LazySpares, with Spares, makes Serve start no process ahead of the
	// first call: each language's spares start once a call of it has run,
	// and are kept while calls come, as with Spares alone. An idle sandbox
	// that no call used then holds the agent alone, at the price of a first
	// Python call that starts python3 (see spares_linux.go).
	LazySpares bool
	// SpareIdle is how long the Python spares that calls started outlive
	// the last call: once no call came for it, the agent drops its zygote
	// and its spares, and keeps what Serve starts (a python3 spare) and the
	// shell's spare (nothing with LazySpares), so that an idle sandbox
	// costs about what a new one does (see shrinkSpares). 0 means DefaultSpareIdle; a negative value, never.
	SpareIdle time.Duration
	// SpareLimits are the limits of the Python spare that Serve starts at
	// once (none with LazySpares); later spares take the limits of the last
	// call of their language. A request with other limits starts a process
	// of its own.
	SpareLimits wire.Limits
	// CPUs is how many CPUs the agent's processes are shown by their
	// affinity (ShowCPUs); 0 (the default): all the agent has.
	CPUs int
	// MemInfo is a /proc/meminfo file that tells how much memory the
	// sandbox uses; while snippets run, the agent reads it and kills those
	// that would exhaust MemoryBudget (see memory_linux.go). In gVisor that
	// is /proc/meminfo itself; empty (the default) turns the watch off.
	MemInfo string
	// MemoryBudget is the memory the sandbox's processes and files may use
	// together, in bytes; 0 (or more than MemTotal) means MemTotal.
	MemoryBudget int64
	// InodeBytes is what the memory watch counts for each inode used in
	// CleanDirs (statfs), on top of MemInfo: in gVisor a file's metadata is
	// memory that /proc/meminfo does not show (runtime.InodeBytes). 0 (the
	// default) counts nothing.
	InodeBytes int64
	// KillStrays makes the agent kill, once no call runs, every process but
	// itself, its spares and its zygote: the processes that calls left
	// behind outside their process group (see strays_linux.go). It takes
	// effect only where orphans come back to the agent, as PID 1 (flmbox-agent
	// in a sandbox) or a child subreaper, and assumes that the agent owns
	// every process there: processes that others start (runsc exec) are
	// killed too.
	KillStrays bool
	// CallbackDir is where the agent makes a call's callback socket
	// (wire.Callback); empty (the default): callbacks are refused. The agent
	// makes it, and it must be writable by the agent alone.
	CallbackDir string
	// Listen makes the agent's listener again after a suspend
	// (wire.Request.Suspend), once the checkpoint is over; nil (the
	// default): the agent refuses to be suspended. It must remove a socket
	// file left at its path.
	Listen func() (net.Listener, error)
	// User is the user that snippets run as; nil (the default): the
	// agent's own. In a sandbox the agent runs as root (of gVisor's user
	// namespace, with a few capabilities) and snippets as the sandbox's
	// user, so that no snippet can signal, trace or connect to the agent,
	// its zygote or its Python spares (see user_linux.go).
	User *User

	once        sync.Once
	python      string // resolved Python, or "" with pythonErr
	pythonErr   error
	shell       string
	shellIsDash bool // small shell code runs as sh -s, and shell spares exist
	dir         string
	workDir     string
	env         []string

	calls  sync.RWMutex // held for reading by each Run, for writing by Reset
	resets atomic.Int32 // Resets waiting or running
	// handOut is the sandbox's current hand-out (wire.Request.HandOut),
	// "" until a reset gives one; set with calls held for writing.
	handOut    atomic.Pointer[string]
	mu         sync.Mutex
	spares     map[string]*proc // by language
	refilling  map[string]*refilling
	pythonUsed bool // a Python snippet ran: spares come from the zygote
	zyg        *zygote
	// reserve is a python3 spare that only a reset takes, kept once a reset
	// has run (resetDone) and the Python spare is no python3 (see Reset).
	reserve        *proc
	resetDone      bool
	zygoteFailures int
	closed         bool
	ln             net.Listener      // Serve's listener
	suspended      chan net.Listener // while suspended: the next listener comes here
	abandon        chan os.Signal    // AbandonSignal
	mem            memWatch
	sweeps         bool        // KillStrays, and orphans come back to the agent
	leftovers      atomic.Bool // a call ran code since the last sweep
	pyEnv          []string    // env for Python processes (see pythonEnv)
	// codeRuns counts the starts and ends of snippets' code: a spare that
	// the snippets' user can reach is used only if no code ran since it
	// started (see spareUsable).
	codeRuns atomic.Int64
	running  atomic.Int32 // snippets running now
	// lingering are the processes of calls that exited by themselves and
	// whose group's grace may not be over (see proc.linger).
	lingerMu  sync.Mutex
	lingering map[*proc]struct{}

	// As PID 1, what clears the sandbox's kernel (leftovers_linux.go).
	keyrings keyrings    // the sandbox's key set
	mqueues  *os.File    // the root of the sandbox's mqueue filesystem, once a reset opened it
	sysv     sysvScanned // where the next reset's removal of System V objects starts

	trimMu sync.Mutex
	trim   *time.Timer // idleTrim's, once a call has ended
	shrink *time.Timer // idleShrink's, once a call has ended
	// shrinks counts the shrinkSpares that dropped what calls started, for
	// tests.
	shrinks atomic.Int32
	// freeOSMemory is what idleTrim calls (nil: debug.FreeOSMemory); tests
	// count its calls.
	freeOSMemory func()

	cbMu      sync.Mutex
	callbacks map[string]*callback // calls' callback sockets, by ID
	// Seams for tests: noFrames makes the agent one of before framed
	// standby connections; standbys counts those attached.
	noFrames bool
	standbys atomic.Int64
}

// init fills in the defaults and resolves the interpreters, once.
func (a *Agent) init() {
	a.once.Do(func() {
		a.env = a.Env
		if a.env == nil {
			a.env = os.Environ()
		}
		a.dir = cmp.Or(a.Dir, "/tmp")
		a.workDir = cmp.Or(a.WorkDir, a.dir)
		a.shell = cmp.Or(a.Shell, "/bin/sh")
		a.shellIsDash = isDash(a.shell)
		a.python, a.pythonErr = lookPath(cmp.Or(a.Python, "python3"), a.env)
		if a.pythonErr != nil {
			a.pythonErr = missing{fmt.Errorf("%w (the image has no Python?)", a.pythonErr)}
		}
		a.pyEnv = pythonEnv(a.env)
		a.sweeps = a.KillStrays && reapsOrphans()
	})
}

// isDash says whether shell is dash, which reads a script on stdin in
// blocks; bash reads it a byte at a time, so that the script's own commands
// could read its rest.
func isDash(shell string) bool {
	real, err := filepath.EvalSymlinks(shell)
	return err == nil && filepath.Base(real) == "dash"
}

// lookPath finds an executable by name in the PATH of env, as the snippet's
// own shell would, or returns a path as is.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path, _ := lookEnv(env, "PATH")
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		if p, err := executable(filepath.Join(dir, name)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("find %s in PATH %q: %w", name, path, exec.ErrNotFound)
}

// lookEnv returns the value of name in env (the last setting wins), else in
// the agent's own environment.
func lookEnv(env []string, name string) (string, bool) {
	value, ok := os.LookupEnv(name)
	for _, kv := range env {
		if v, found := strings.CutPrefix(kv, name+"="); found {
			value, ok = v, true
		}
	}
	return value, ok
}

// Serve accepts connections on ln until ctx is cancelled, and answers each
// one concurrently: it reads one Request, runs it with Run, writes one Result
// and closes the connection. A client that hangs up before the answer
// cancels its snippet, which is killed; one that shuts down its sending
// side during an Interruptible request interrupts it: the snippet is
// killed and the answer carries what it printed (Result.Interrupted).
//
// When the agent is PID 1 (as in a sandbox) or a child subreaper, Serve also
// reaps the orphaned processes that the kernel hands to it, so that killed
// background processes do not pile up as zombies. The program running Serve
// must then not wait for other child processes of its own.
//
// Serve closes ln. After ctx is cancelled it kills the snippets still
// running, answers their clients, and returns nil; otherwise it returns the
// listener's error.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	a.init()
	defer a.Close()
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel: the calls and the reaper end with ctx
	if !a.LazySpares {
		a.refill(wire.LanguagePython, a.SpareLimits)
	}
	if os.Getpid() == 1 {
		a.startSealingKeyrings() // no snippet may make a keyring: it would outlive it
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	defer cancel(errAgentStopping)
	a.setListener(ln)
	a.watchAbandon()
	stop := context.AfterFunc(parent, func() {
		cancel(errAgentStopping)
		a.listener().Close()
	})
	defer stop()
	defer func() { a.listener().Close() }()
	if reapsOrphans() {
		wg.Go(func() { reapLoop(ctx) })
	}
	a.idleTrim() // what starting took, unless a call comes first
	var backoff time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if next, ok := a.awaitResume(ctx); ok {
				ln = next // a suspend closed the listener: here is the next
				continue
			}
			if isTemporary(err) { // out of descriptors: wait for calls to end
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
				}
				continue
			}
			return fmt.Errorf("accept a client: %w", err)
		}
		backoff = 0
		wg.Go(func() { a.serveConn(ctx, conn) })
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// serveConn answers one connection. What follows a call (afterCall) is done
// once the answer is sent: under gVisor, it takes CPU that the answer would
// otherwise wait for.
func (a *Agent) serveConn(ctx context.Context, conn net.Conn) {
	w := &answerWriter{conn: conn}
	req, res, ran := a.answer(ctx, conn, w.event)
	if res == nil {
		return // an attached callback connection: not ours to close
	}
	defer conn.Close()
	w.result(res)
	a.afterCall(req, ran)
}

// answerWriter writes a call's events and then its result on conn.
type answerWriter struct {
	mu   sync.Mutex
	conn net.Conn
	done bool
}

// event sends ev, unless the result was sent.
func (w *answerWriter) event(ev wire.Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return errors.New("the call has ended")
	}
	w.conn.SetWriteDeadline(time.Now().Add(responseTimeout))
	b, _ := json.Marshal(ev)
	_, err := w.conn.Write(append(b, '\n'))
	return err
}

func (w *answerWriter) result(res *wire.Result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	w.conn.SetWriteDeadline(time.Now().Add(responseTimeout))
	bw := bufio.NewWriterSize(w.conn, 64<<10)
	if json.NewEncoder(bw).Encode(res) == nil {
		bw.Flush() // a client that left does not read it: nothing to do
	}
}

// afterCall kills what the calls left behind, if none is running, and
// starts the next spare of req's language if a process ran req's code. With
// lazy spares, a reset with no code (a pool's release) is no use of its
// language: a pooled sandbox waits with the agent alone.
func (a *Agent) afterCall(req *wire.Request, ran bool) {
	a.sweepStrays()
	if ran && !(a.LazySpares && req.Reset && req.Code == "") {
		a.refill(req.Language, req.Limits)
	}
	a.idleTrim()
	a.idleShrink()
}

// trimAfter is how long the agent waits, once a call has ended and none
// followed, before it returns its free heap to the kernel.
const trimAfter = time.Second

// idleTrim returns the agent's free memory to the kernel (a garbage
// collection, then debug.FreeOSMemory) once no call came for trimAfter. Under
// gVisor, memory the agent's heap grew to (each call's buffers;
// docs/PERFORMANCE.md, "The agent's heap") stays in the sandbox's memory file,
// charged to the host, until Go's scavenger returns it, which it does slowly;
// freed pages go back to the host at once. Calls back to back never wait for
// it.
func (a *Agent) idleTrim() {
	a.trimMu.Lock()
	defer a.trimMu.Unlock()
	if a.trim == nil {
		a.trim = time.AfterFunc(trimAfter, func() {
			switch {
			case a.running.Load() > 0: // the call's end sets the timer again
			case a.freeOSMemory != nil:
				a.freeOSMemory()
			default:
				debug.FreeOSMemory()
			}
		})
		return
	}
	a.trim.Reset(trimAfter)
}

// answer reads the request on conn and runs it, sending its events with
// notify; ran is run's. An Attach request hands conn to its callback and
// has no result (nil).
func (a *Agent) answer(ctx context.Context, conn net.Conn, notify func(wire.Event) error) (req *wire.Request, res *wire.Result, ran bool) {
	conn.SetReadDeadline(time.Now().Add(requestTimeout))
	req, rest, err := readRequest(conn)
	if err != nil {
		return nil, errorResult(err), false
	}
	conn.SetReadDeadline(time.Time{})
	if req.Attach != "" && req.Standby {
		a.standby(req.Attach, withPrefix(conn, rest), req.Frames)
		return req, nil, false
	}
	if req.Attach != "" {
		a.attach(req.Attach, withPrefix(conn, rest), req.AttachError != "")
		return req, nil, false
	}
	if req.Suspend && req.Validate() == nil {
		return req, a.suspend(), false
	}
	if req.Copy != nil && req.Validate() == nil {
		return req, a.copy(ctx, req.Copy, conn, rest), false
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if uc, ok := conn.(*net.UnixConn); ok {
		stop := watchHangup(uc, req.Interruptible, a.nudgeMemory, func(interrupt bool) {
			if interrupt {
				cancel(errInterrupted)
			} else {
				cancel(errClientGone)
			}
		})
		defer stop()
	}
	res, ran = a.run(ctx, req, notify) // run says when the interrupt stopped it (Result.Interrupted)
	return req, res, ran
}

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection, as a *net.UnixConn does.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// withPrefix is conn with rest, what was read of it past the request, to
// be read first.
func withPrefix(conn net.Conn, rest []byte) net.Conn {
	if len(rest) == 0 {
		return conn
	}
	return &prefixConn{Conn: conn, r: io.MultiReader(bytes.NewReader(rest), conn)}
}

// Causes of a cancelled call.
var (
	errClientGone    = errors.New("the client hung up")
	errInterrupted   = errors.New("the client interrupted the call")
	errAgentStopping = errors.New("the agent is stopping")
)

// readRequest decodes one request, of any protocol version, from r, and
// returns what it read of r past it (an attached connection's first bytes).
func readRequest(r io.Reader) (*wire.Request, []byte, error) {
	lr := &io.LimitedReader{R: r, N: maxRequestSize + 1}
	var raw json.RawMessage
	dec := json.NewDecoder(lr)
	if err := dec.Decode(&raw); err != nil {
		if lr.N <= 0 {
			return nil, nil, fmt.Errorf("read request: over %d bytes", maxRequestSize)
		}
		return nil, nil, fmt.Errorf("read request: %w", err)
	}
	rest, _ := io.ReadAll(dec.Buffered())
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, nil, fmt.Errorf("read request: %w", err)
	}
	if v.Version != wire.ProtocolVersion {
		// Validate names both versions; the rest may not even parse.
		return &wire.Request{Version: v.Version}, nil, nil
	}
	var req wire.Request
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, nil, fmt.Errorf("read request: %w", err)
	}
	return &req, rest, nil
}

// errorResult is the answer to a request that could not be run.
func errorResult(err error) *wire.Result {
	return &wire.Result{Version: wire.ProtocolVersion, ExitCode: -1, Error: err.Error(), Missing: errors.As(err, new(missing))}
}

// missing is the error of a snippet whose program (interpreter, shell) is
// not in the image (wire.Result.Missing).
type missing struct{ error }

func (m missing) Unwrap() error { return m.error }

// staleResult refuses a request of a hand-out that is not the current one,
// or returns nil. The caller holds calls (for reading or writing): a reset
// changes the hand-out only while it holds them for writing.
func (a *Agent) staleResult(handOut string) *wire.Result {
	cur := a.handOut.Load()
	if handOut == "" || cur == nil || *cur == "" || *cur == handOut {
		return nil
	}
	res := errorResult(errors.New("the sandbox was given back and handed out again: this request's hand-out is over"))
	res.Stale = true
	return res
}
