package wire

import (
	"context"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ProtocolVersion is the version of the agent protocol that this package
// speaks. A request and a result carry it; an agent answers a request of
// another version with an error result, and Call turns a result of another
// version into an error that tells the user to recreate the sandbox.
const ProtocolVersion = 4

// Languages of a Request.
const (
	// LanguagePython runs the code with the image's python3.
	LanguagePython = "python"
	// LanguageShell runs the code with /bin/sh -c.
	LanguageShell = "shell"
)

// Bounds of a Request.
const (
	// MaxCodeSize is the largest code, in bytes, that a request may carry.
	MaxCodeSize = 1 << 20
	// MaxShellCodeSize is the largest shell code, in bytes. Shell code is
	// passed as one argument of sh -c, and Linux refuses an argument of
	// 128 KiB or more (MAX_ARG_STRLEN); Python code has no such limit
	// because it is not passed on the command line.
	MaxShellCodeSize = 127 << 10
	// MaxTimeout is the longest timeout a request may ask for.
	MaxTimeout = 24 * time.Hour
	// DefaultMaxOutput is the number of bytes kept of each of stdout and
	// stderr when a request's MaxOutput is 0.
	DefaultMaxOutput = 1 << 20
	// MaxMaxOutput is the largest MaxOutput a request may ask for. The agent
	// and the client hold up to twice this much (both streams) per call.
	MaxMaxOutput = 64 << 20
	// MaxStdinSize is the largest Stdin a request may carry.
	MaxStdinSize = 8 << 20
	// MaxEnvSize is the most that a request's Env may hold, in bytes of its
	// K=V settings.
	MaxEnvSize = 64 << 10
)

// Request asks an agent to run one snippet. The zero values of MaxOutput
// and of each limit select a default; Validate checks the rest.
type Request struct {
	// Version is ProtocolVersion.
	Version int `json:"version"`
	// Language is LanguagePython or LanguageShell.
	Language string `json:"language"`
	// Code is the snippet's source: valid UTF-8 without NUL bytes, at most
	// MaxCodeSize bytes (MaxShellCodeSize for shell).
	Code string `json:"code"`
	// TimeoutMS is how long the snippet may run, in milliseconds: more than
	// 0 and at most MaxTimeout. When it expires the snippet's whole process
	// group is killed.
	TimeoutMS int64 `json:"timeout_ms"`
	// MaxOutput is the number of bytes kept of each of stdout and stderr:
	// the first and the last MaxOutput/2 bytes (DefaultMaxOutput when 0, at
	// most MaxMaxOutput; see Output).
	MaxOutput int64 `json:"max_output"`
	// Limits bound the snippet's own process and its descendants.
	Limits Limits `json:"limits"`
	// Reset returns the sandbox to a clean state before the snippet runs, as
	// if it were new: every other process is killed and the agent's
	// CleanDirs (/tmp and /dev/shm in a sandbox) are emptied (see
	// Agent.Reset). Calls running at the time finish first.
	Reset bool `json:"reset,omitempty"`
	// HandOut, if set, is the hand-out of the sandbox its client holds (a
	// handle's, bound to one holder of the sandbox): the agent refuses the
	// request (Result.Stale) unless HandOut is its current hand-out, or it
	// has none yet. NewHandOut, with Reset, is the agent's hand-out once the
	// reset holds its lock: from then on, a request of an earlier hand-out
	// is refused, so that a holder's stale handle never reaches the next
	// holder. An agent of before these fields ignores them.
	HandOut    string `json:"hand_out,omitempty"`
	NewHandOut string `json:"new_hand_out,omitempty"`
	// Ping asks the agent only to answer, at once, with an empty Result (exit
	// status 0), whatever the calls running: the host's check that the agent
	// is responsive. The other fields are ignored. (An agent that predates
	// it answers an error Result, which is an answer too.)
	Ping bool `json:"ping,omitempty"`
	// Interruptible says that the client keeps its side of the connection
	// open for writing after the request, and that shutting it down
	// (SHUT_WR, the agent reads EOF) interrupts the call: the agent kills the
	// snippet and answers with what it printed so far (Result.Interrupted).
	// A client that closes the connection still just cancels the call. An
	// agent of before this field ignores it: it kills the snippet only when
	// the client closes the connection, and never answers an interrupt.
	Interruptible bool `json:"interruptible,omitempty"`
	// MemoryNudges says that the client of an Interruptible request watches
	// what the sandbox's memory costs the host, and writes MemoryNudge on
	// the connection each time it grew by MemoryNudgeStep: the agent then
	// reads the sandbox's memory at once, and otherwise only every second
	// or so while memory is not short. A read from inside costs the
	// sandbox's CPU, which the snippets would have had; the host's counter
	// costs it nothing. An agent of before this field reads as it did.
	MemoryNudges bool `json:"memory_nudges,omitempty"`
	// Charged, the client's side of MemoryNudges, not sent: it returns
	// what the sandbox's memory costs the host now, in bytes (its memory
	// cgroup's charge). Call nudges the agent when it is set.
	Charged func() (int64, error) `json:"-"`
	// Stdin is the snippet's standard input, at most MaxStdinSize bytes,
	// followed by EOF. Empty (the default): stdin is at EOF at once.
	Stdin []byte `json:"stdin,omitempty"`
	// Env are K=V settings added to the snippet's environment for this
	// call, after the sandbox's (a later setting of a name wins), at most
	// MaxEnvSize bytes.
	Env []string `json:"env,omitempty"`
	// Interpreter names the program that runs the code in place of the
	// language's (python3, /bin/sh), in one of three forms: a command found
	// in the sandbox's PATH, such as python3.11 or bash; an absolute path in
	// the sandbox, such as /usr/bin/python3.11 or /bin/bash; or, for Python,
	// a version, such as 3.11, which names the image's python3.11 ("python"
	// and "3" name the language's own). Python code runs under it with
	// flmbox's bootstrap (INTERPRETER -S -s -u -c), so it must be a Python 3;
	// shell code as INTERPRETER -c, so it must take POSIX sh's -c. One the
	// image lacks fails the call (ExitCode -1, Error, which names the
	// Pythons the image has for a Python version).
	Interpreter string `json:"interpreter,omitempty"`
	// File, if set, runs the code as a file of that name, as python3 FILE
	// or sh FILE would: the agent writes the code to FILE in a new
	// directory of the snippets' working directory (/tmp/.flmbox-ID/FILE,
	// the snippets' user's), and __file__ and sys.argv[0] (Python) or $0
	// (shell) name it, as tracebacks and error messages do. The working
	// directory and sys.path are as without it; the directory is removed
	// when the call ends. File is a base name (no '/'), at most 255 bytes.
	File string `json:"file,omitempty"`
	// Callback, if set, opens a channel from the snippet to the client for
	// this call: see Callback.
	Callback *Callback `json:"callback,omitempty"`
	// CallbackDial is the client's side of Callback, not sent: it makes the
	// host's end of each of the snippet's callback connections (a new
	// connection to the caller's server), which Call forwards (see Event).
	CallbackDial func(ctx context.Context) (io.ReadWriteCloser, error) `json:"-"`
	// Attach makes this connection the host's end of the snippet's callback
	// connection that an Event named: once the request is read, the agent
	// forwards bytes both ways between the two until either closes, the
	// call ends or a limit is hit. No Result is sent. With AttachError set,
	// the host refuses that connection instead (it could not reach its
	// server): the snippet's connection is closed and counted refused.
	// With Standby, Attach names a call's callbacks (Event.Ready) and the
	// connection waits for the next snippet's connection: the agent then
	// writes CallbackWake on it, with the snippet's first bytes, and
	// forwards; the client dials its server on that first byte. With
	// Frames too (only to an agent whose Event.Ready said Frames), the
	// standby connection carries frames (CallbackData) and is used again
	// for the next connections; without, it carries one connection's bytes
	// and is closed with it.
	Attach      string `json:"attach,omitempty"`
	AttachError string `json:"attach_error,omitempty"`
	Standby     bool   `json:"standby,omitempty"`
	Frames      bool   `json:"frames,omitempty"`
	// Copy, if set, makes the request a copy of files into or out of the
	// sandbox (see Copy); its other fields but Version are ignored.
	Copy *Copy `json:"copy,omitempty"`
	// Suspend asks the agent to make the sandbox ready for a checkpoint
	// (runsc checkpoint), unless a call is running (then it refuses): it
	// closes its listener, removing its socket, which gVisor cannot save,
	// answers (Result.Suspended), and listens again once the checkpoint is
	// over: restored, resumed or failed. No call can start meanwhile. The
	// other fields but Version are ignored.
	Suspend bool `json:"suspend,omitempty"`
}

// MemoryNudge is the byte a client of MemoryNudges writes after its
// request each time the sandbox's memory grew by MemoryNudgeStep since the
// last (or since it was least).
const MemoryNudge = 'm'

// MemoryNudgeStep is the growth of the sandbox's memory, as the host
// charges it, that a client of MemoryNudges tells the agent of: half the
// smallest memory watch reserve (16 MiB). MemoryNudgePoll is how often the
// client reads the charge: at the fastest growth seen (2 GiB/s) the agent
// reads every 5 ms, as often as it did by the clock in the middle of its
// range, and it hears of growth 8 to 18 MiB after it happened.
const (
	MemoryNudgeStep = 8 << 20
	MemoryNudgePoll = 5 * time.Millisecond
)

// AbandonSignal, sent to a suspended agent (runsc kill), tells it that the
// checkpoint it was suspended for will not come (the flmbox that asked for
// it was killed): it listens again at once. An agent that is not suspended
// ignores it.
const AbandonSignal = unix.SIGUSR1

// CallbackSocketEnv names the variable that holds the path, inside the
// sandbox, of a call's callback socket.
const CallbackSocketEnv = "FLMBOX_CALLBACK_SOCKET"

// Callback asks the agent to listen, for one call, on a Unix socket inside
// the sandbox whose path the snippet finds in CallbackSocketEnv (and Env):
// each connection that the call's own processes make to it is announced to
// the client (an Event on the call's connection, before the Result), which
// attaches a new connection of its own (Request.Attach) to be forwarded to.
// When the call ends, the socket is removed and every forwarded connection
// closed. What is refused (over MaxConns, a process of another call, a
// connection the client refuses or does not attach within seconds) is
// accepted and closed at once: the snippet reads EOF. The zero values of the
// limits select their defaults.
type Callback struct {
	// Env names more variables set to the socket's path (such as
	// HERMES_RPC_SOCKET): shell identifiers, at most 8.
	Env []string `json:"env,omitempty"`
	// MaxConns is the most connections forwarded (default 50).
	MaxConns int `json:"max_conns,omitempty"`
	// MaxBytes is the most bytes forwarded for the whole call, both
	// directions of all its connections together: the connection whose
	// bytes cross it is cut, and later ones are refused (default 256 MiB).
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// IdleMS, if set, cuts a connection that carried no byte, either way,
	// for that long. By default a connection lives as long as the call (its
	// timeout bounds it): a client may keep one connection open for the
	// whole call and stay silent in it as long as it likes, as Hermes'
	// execute_code does.
	IdleMS int64 `json:"idle_ms,omitempty"`
}

// Defaults and bounds of a Callback. The default budget carries Hermes'
// execute_code at its own limit, 50 tool calls, each answered with 1 MB,
// five times over.
const (
	DefaultCallbackConns = 50
	DefaultCallbackBytes = 256 << 20
	MaxCallbackConns     = 1024
	MaxCallbackBytes     = 16 << 30
	MaxCallbackIdle      = MaxTimeout
)

// Limits returns c's limits with the defaults filled in; idle is 0 for no
// idle cut.
func (c *Callback) Limits() (conns int, bytes int64, idle time.Duration) {
	conns, bytes, idle = c.MaxConns, c.MaxBytes, time.Duration(c.IdleMS)*time.Millisecond
	if conns == 0 {
		conns = DefaultCallbackConns
	}
	if bytes == 0 {
		bytes = DefaultCallbackBytes
	}
	return conns, bytes, idle
}

func (c *Callback) validate() error {
	if len(c.Env) > 8 {
		return fmt.Errorf("callback: %d variables named, at most 8", len(c.Env))
	}
	for _, name := range c.Env {
		if !validEnvName(name) {
			return fmt.Errorf("callback variable %q: want a name of letters, digits and '_', not starting with a digit", name)
		}
		if reservedEnvName(name) {
			return fmt.Errorf("callback variable %q: a name the shell, Python or flmbox set themselves; choose another", name)
		}
	}
	if c.MaxConns < 0 || c.MaxConns > MaxCallbackConns {
		return fmt.Errorf("callback connections %d: want 0 (the default, %d) up to %d", c.MaxConns, DefaultCallbackConns, MaxCallbackConns)
	}
	if c.MaxBytes < 0 || c.MaxBytes > MaxCallbackBytes {
		return fmt.Errorf("callback bytes %d: want 0 (the default, %d) up to %d", c.MaxBytes, DefaultCallbackBytes, MaxCallbackBytes)
	}
	if c.IdleMS < 0 || c.IdleMS > MaxCallbackIdle.Milliseconds() {
		return fmt.Errorf("callback idle time %s: want 0 (the default: none) up to %s", formatTimeoutMS(c.IdleMS), MaxCallbackIdle)
	}
	return nil
}

// reservedEnvName says whether a callback variable's name would override
// what the shell, Python, the loader or flmbox set.
func reservedEnvName(name string) bool {
	switch name {
	case "PATH", "HOME", "IFS", "UID", "EUID", "PPID", "SHELL", "PWD", "ENV":
		return true
	}
	for _, prefix := range []string{"LD_", "PYTHON", "FLMBOX_"} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// validEnvName says whether name is a shell identifier.
func validEnvName(name string) bool {
	if name == "" || len(name) > 128 || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Event is what the agent sends on a call's connection, before the Result,
// for a call with a Callback. Ready, first, names the call's callbacks: the
// client keeps a standby connection attached to them (Request.Standby), which
// the next connection of the snippet takes at once. Callback names a
// snippet's connection that found no standby: the client attaches a
// connection to it (Request.Attach) or refuses it. Frames, with Ready, says
// that the agent takes framed standby connections (Request.Frames); an
// agent of before them does not say so, and a client of before them ignores
// it.
type Event struct {
	Ready    string `json:"ready,omitempty"`
	Frames   bool   `json:"frames,omitempty"`
	Callback string `json:"callback,omitempty"`
}

// CallbackWake is the byte the agent writes first on a standby connection
// that a snippet's connection took, before the snippet's bytes: the client
// then dials its server and forwards what follows. A client that cannot
// reach its server closes the connection (the snippet reads EOF) and counts
// it refused in the Result.
const CallbackWake = '\n'

// CallbackStats count a call's callback connections, for the Result.
type CallbackStats struct {
	// Connections is the number of connections forwarded; Refused, the
	// number closed at once (see Callback).
	Connections int `json:"connections"`
	Refused     int `json:"refused"`
	// BytesIn went from the host to the snippet, BytesOut from the
	// snippet to the host.
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
}

// PingRequest returns a Ping request.
func PingRequest() *Request { return &Request{Version: ProtocolVersion, Ping: true} }

// Limits are resource limits (rlimits) set on a snippet's process before
// any of its code runs, and inherited by the processes it starts. A zero
// field sets no limit. A limit above the agent's own hard limit is lowered to
// it (an unprivileged agent cannot raise a hard limit).
//
// Under gVisor these keep a runaway snippet from killing its sandbox: the
// sandbox's cgroup limits apply to the whole sandbox, which dies when it hits
// them, while an rlimit only fails the snippet's own fork or write. Memory
// is not among them: RLIMIT_AS counts address space, not memory used (glibc
// reserves 64 MiB per thread for its arenas), and so failed threads and
// large read-only maps long before memory ran out; the agent's memory watch
// (Agent.MemoryBudget) bounds what the snippets use.
type Limits struct {
	// Procs is RLIMIT_NPROC: fork fails with EAGAIN once the snippet's user
	// has this many processes (threads included) in the whole sandbox: the
	// other snippets running at the same time count too (in flmbox's
	// sandboxes the agent, its zygote and its Python spares run as another
	// user and do not). Root ignores it.
	Procs int64 `json:"procs"`
	// FileBytes is RLIMIT_FSIZE: the largest file a process may write.
	// Writing past it fails with EFBIG in Python and kills a process that
	// does not ignore SIGXFSZ (a shell's "File size limit exceeded").
	FileBytes int64 `json:"file_bytes"`
}

// Output is what a snippet wrote to one stream.
type Output struct {
	// Data is the output, unchanged (it need not be UTF-8; JSON carries it
	// as base64), or, when it was longer than the request's MaxOutput
	// (Truncated), its first MaxOutput/2 bytes: always an exact prefix of
	// what the snippet wrote, never with text of flmbox's in it.
	Data []byte `json:"data"`
	// Tail, when Truncated, is the output's last MaxOutput/2 bytes; the
	// Total-len(Data)-len(Tail) bytes between Data and Tail are left out.
	Tail []byte `json:"tail,omitempty"`
	// Total is the number of bytes the snippet wrote to the stream.
	Total int64 `json:"total"`
	// Truncated says that Data is a prefix of the output, not all of it.
	Truncated bool `json:"truncated"`
}

// Result is the outcome of one snippet.
type Result struct {
	// Version is the agent's ProtocolVersion.
	Version int `json:"version"`
	// ExitCode is the snippet's exit status, 128+N if signal N killed it
	// (137 for a snippet killed on timeout), or -1 if the snippet could not
	// be run (Error says why).
	ExitCode int `json:"exit_code"`
	// Stdout and Stderr are the snippet's output.
	Stdout Output `json:"stdout"`
	Stderr Output `json:"stderr"`
	// TimedOut says that the snippet ran out of time and was killed; the
	// CLI maps it to exit status 124.
	TimedOut bool `json:"timed_out"`
	// Stale says that the request was refused because its HandOut (or its
	// Copy's) is not the sandbox's current one: nothing ran.
	Stale bool `json:"stale,omitempty"`
	// Signal names the signal that ended the snippet ("SIGKILL"), if any.
	Signal string `json:"signal,omitempty"`
	// OOMKilled says that the agent killed the snippet (SIGKILL, exit
	// status 137) because the sandbox was running out of memory, its
	// processes' and its /tmp's together; the CLI says so on stderr.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// Interrupted says that the client interrupted the call
	// (Request.Interruptible) before the snippet ended: the snippet was
	// killed with SIGKILL (ExitCode 137, as on timeout), or never started
	// (ExitCode -1 and Error), and Stdout and Stderr hold what it printed
	// until then.
	Interrupted bool `json:"interrupted,omitempty"`
	// Callbacks counts the call's callback connections, for a call with a
	// Callback.
	Callbacks *CallbackStats `json:"callbacks,omitempty"`
	// Copied counts what a Copy request copied (set by an agent that
	// copies, even when it fails: Error).
	Copied *CopyStats `json:"copied,omitempty"`
	// Suspended says that the agent is ready for a checkpoint (Suspend).
	Suspended bool `json:"suspended,omitempty"`
	// DurationMS is the wall time of the snippet's process, from its start
	// to its exit, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
	// Error is set, with ExitCode -1, when the agent could not run the
	// snippet: a bad request, a missing interpreter, a call cancelled.
	Error string `json:"error,omitempty"`
	// Missing, with Error, says that the program that runs the snippet
	// (its interpreter, the shell) is not in the sandbox's image: a
	// command line says so as a shell does, with status 127.
	Missing bool `json:"missing,omitempty"`
}

// Validate checks a request before it is sent or run. Its errors match
// errdefs.ErrInvalidArgument and say what to change.
func (r *Request) Validate() error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (r *Request) validate() error {
	if r == nil {
		return fmt.Errorf("no request")
	}
	if r.Version != ProtocolVersion {
		return fmt.Errorf("request speaks protocol %d, this side speaks %d", r.Version, ProtocolVersion)
	}
	if r.Ping {
		return nil // its other fields are ignored
	}
	if r.Copy != nil {
		return r.Copy.validate()
	}
	if r.Suspend {
		return nil
	}
	maxCode := MaxCodeSize
	switch r.Language {
	case LanguagePython:
	case LanguageShell:
		if r.File == "" { // passed to sh -c, not in a file
			maxCode = MaxShellCodeSize
		}
	default:
		return fmt.Errorf("language %q: want %s or %s", r.Language, LanguagePython, LanguageShell)
	}
	if len(r.Code) > maxCode {
		return fmt.Errorf("%s code is %d bytes, over the limit of %d; write it to a file under /tmp in one call and run that file in the next",
			r.Language, len(r.Code), maxCode)
	}
	if i := strings.IndexByte(r.Code, 0); i >= 0 {
		return fmt.Errorf("code holds a NUL byte at offset %d; interpreters cannot take one", i)
	}
	if !utf8.ValidString(r.Code) {
		return fmt.Errorf("code is not valid UTF-8; the protocol carries code as a JSON string")
	}
	if r.TimeoutMS <= 0 || r.TimeoutMS > MaxTimeout.Milliseconds() {
		return fmt.Errorf("timeout %s: want more than 0 and at most %s", formatTimeoutMS(r.TimeoutMS), MaxTimeout)
	}
	if r.MaxOutput < 0 || r.MaxOutput > MaxMaxOutput {
		return fmt.Errorf("max output %d bytes: want 0 (the default, %d) up to %d", r.MaxOutput, DefaultMaxOutput, MaxMaxOutput)
	}
	if len(r.Stdin) > MaxStdinSize {
		return fmt.Errorf("stdin is %d bytes, over the limit of %d; write it to a file under /tmp in one call and read that file in the next",
			len(r.Stdin), MaxStdinSize)
	}
	if err := validateEnv(r.Env); err != nil {
		return err
	}
	if r.Callback != nil {
		if err := r.Callback.validate(); err != nil {
			return err
		}
	}
	if err := validInterpreter(r.Interpreter, r.Language); err != nil {
		return err
	}
	if err := validFile(r.File); err != nil {
		return err
	}
	if l := r.Limits; l.Procs < 0 || l.FileBytes < 0 {
		return fmt.Errorf("limits must not be negative (0 sets none): procs %d, file size %d", l.Procs, l.FileBytes)
	}
	return nil
}

// validateEnv checks a request's K=V settings.
func validateEnv(env []string) error {
	size := 0
	for _, kv := range env {
		size += len(kv)
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || k == "":
			return fmt.Errorf("env %q: want NAME=VALUE", kv)
		case strings.IndexByte(kv, 0) >= 0:
			return fmt.Errorf("env %q: holds a NUL byte", k)
		}
	}
	if size > MaxEnvSize {
		return fmt.Errorf("env holds %d bytes, over the limit of %d", size, MaxEnvSize)
	}
	return nil
}

// validInterpreter checks a request's Interpreter (see Request).
func validInterpreter(name, language string) error {
	switch {
	case name == "":
		return nil
	case strings.HasPrefix(name, "/"):
		if len(name) > 4096 || strings.IndexByte(name, 0) >= 0 || !utf8.ValidString(name) || path.Clean(name) != name || name == "/" {
			return fmt.Errorf("interpreter %q: want a clean absolute path such as /usr/bin/python3.11", name)
		}
		return nil
	case PythonVersion(name) != "" && language != LanguagePython:
		return fmt.Errorf("interpreter %q: a version names a Python; for shell, name a shell such as bash or /bin/sh", name)
	}
	if len(name) > 64 || !(name[0] >= 'a' && name[0] <= 'z' || name[0] >= 'A' && name[0] <= 'Z' || name[0] >= '0' && name[0] <= '9') {
		return fmt.Errorf("interpreter %q: want a command name such as python3.11 or bash, an absolute path, or a Python version such as 3.11", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._+-", c)) {
			return fmt.Errorf("interpreter %q: want a command name such as python3.11 or bash (letters, digits, '.', '_', '+', '-'), an absolute path, or a Python version such as 3.11", name)
		}
	}
	return nil
}

// PythonVersion returns the command that the Python version name stands
// for ("3.11": "python3.11"; "3": "python3"), or "" if name is not a
// version (digits and dots, starting with 3).
func PythonVersion(name string) string {
	if name != "3" && !strings.HasPrefix(name, "3.") {
		return ""
	}
	for _, part := range strings.Split(name, ".") {
		if part == "" || len(part) > 4 || strings.Trim(part, "0123456789") != "" {
			return ""
		}
	}
	return "python" + name
}

// validFile checks a request's File: a base name.
func validFile(name string) error {
	switch {
	case name == "":
		return nil
	case len(name) > 255, name == ".", name == "..", strings.ContainsAny(name, "/\x00"), !utf8.ValidString(name):
		return fmt.Errorf("file name %q: want a base name such as main.py (no '/', at most 255 bytes)", name)
	}
	return nil
}

// formatTimeoutMS writes a timeout of ms milliseconds as a duration
// ("1000000h0m0s"), or in hours when a time.Duration cannot hold it.
func formatTimeoutMS(ms int64) string {
	if limit := int64(1<<63-1) / int64(time.Millisecond); ms > limit || ms < -limit {
		return strconv.FormatInt(ms/int64(time.Hour/time.Millisecond), 10) + "h"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// OutputLimit is the request's MaxOutput with the default filled in.
func (r *Request) OutputLimit() int64 {
	if r.MaxOutput == 0 {
		return DefaultMaxOutput
	}
	return r.MaxOutput
}
