package runcmd

import (
	"strconv"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Kind is how a flag's value is read.
type Kind int

// Kinds of flags.
const (
	String   Kind = iota
	Bool          // no value, or =true/=false
	Duration      // time.ParseDuration
	Size          // a size such as 1MiB (the flmbox command takes plain byte counts only)
	Int
	List // repeatable: each value kept whole
)

// Flag is one flag of the table.
type Flag struct {
	Name    string
	Aliases []string
	Kind    Kind
	// Default is the value when the flag is not given, as it would be
	// written on the command line ("" for none).
	Default string
	// DefaultText is what help says of a flag whose Default is empty, in
	// place of its zero value ("" says nothing more).
	DefaultText string
	// EnvVars set the flag when it is not given (global flags).
	EnvVars []string
	Usage   string
	// Warm marks the flags that the flmbox command parses itself for a warm
	// call; a command line with any other flag goes to flmbox-core.
	Warm bool
}

// Names are the flag's name and its aliases.
func (f Flag) Names() []string { return append([]string{f.Name}, f.Aliases...) }

// DefaultRoot is the state root when neither --root nor FLMBOX_ROOT names
// one.
const DefaultRoot = "/var/lib/flmbox"

// Defaults of run's flags: sandbox's (a test of package app checks that
// they agree; this package is linked into the flmbox command, which must
// not import sandbox).
const (
	DefaultTimeout   = 30 * time.Second
	DefaultMaxOutput = "1MiB"
	// DefaultCallbackBytes is wire.DefaultCallbackBytes as --callback-bytes
	// writes it (a test checks they agree).
	DefaultCallbackBytes = "256MiB"
)

// GlobalFlags are flmbox's global flags.
var GlobalFlags = []Flag{
	{Name: "root", Kind: String, Default: DefaultRoot, EnvVars: []string{"FLMBOX_ROOT"}, Warm: true,
		Usage: "state root: image cache and sandboxes"},
	{Name: "runsc", Kind: String, EnvVars: []string{"FLMBOX_RUNSC"}, Warm: true,
		Usage: "runsc binary (default: runsc on PATH)"},
	{Name: "debug", Kind: Bool, EnvVars: []string{"FLMBOX_DEBUG"},
		Usage: "print debugging details"},
}

// RunFlags are run's own flags (the flags that configure a new sandbox,
// shared with sandbox create, are flmbox-core's).
var RunFlags = []Flag{
	{Name: "sandbox", Kind: String, Warm: true, Usage: "run in this persistent sandbox"},
	{Name: "image", Kind: String, Usage: "run in a clean sandbox from IMAGE (taken from its pool if one is idle there), removed or pooled again afterwards"},
	{Name: "language", Aliases: []string{"l"}, Kind: String, Default: "python", Warm: true, Usage: "python or shell"},
	{Name: "timeout", Kind: Duration, Default: DefaultTimeout.String(), Warm: true, Usage: "kill the snippet after this long (exit status 124)"},
	{Name: "code", Aliases: []string{"c"}, Kind: String, Warm: true, Usage: "the code to run"},
	{Name: "env", Aliases: []string{"e"}, Kind: List, Warm: true, Usage: "set `K=V` in the snippet's environment, for this call only (repeatable; with --batch, every snippet's); sandbox create --env sets a sandbox's"},
	{Name: "interactive", Aliases: []string{"i"}, Kind: Bool, Usage: "give flmbox's stdin, read to its end (at most 8MiB), to the snippet as its stdin (without it, the snippet reads EOF at once)"},
	{Name: "copy", Kind: List, Usage: "before the code runs, copy `HOST_PATH:SANDBOX_PATH` into the sandbox as flmbox cp HOST_PATH NAME:SANDBOX_PATH does (repeatable; SANDBOX_PATH absolute, under /tmp)"},
	{Name: "max-output", Kind: Size, Default: DefaultMaxOutput, Warm: true, Usage: "bytes of stdout and of stderr kept: the first and the last halves"},
	{Name: "reset", Kind: Bool, Warm: true, Usage: "with --sandbox: first return the sandbox to a clean state (kill its processes, empty /tmp and /dev/shm)"},
	{Name: "batch", Kind: String, Usage: "run a batch of 1 to 64 snippets from `FILE` (- for stdin) and print a JSON array of results in input order"},
	{Name: "parallel", Kind: Int, DefaultText: "the number of CPUs", Usage: "run at most `N` batch snippets at once"},
	{Name: "json", Kind: Bool, Warm: true, Usage: "print JSON"},
	// Callbacks (sandbox.Callback): never Warm, so that the flmbox command
	// hands such a call to flmbox-core, which forwards the connections.
	{Name: "callback", Kind: String, Usage: "for this call, forward each connection the snippet makes to the socket in $FLMBOX_CALLBACK_SOCKET to a new connection to the Unix socket `HOST_SOCKET` on the host"},
	{Name: "callback-env", Kind: List, Usage: "with --callback: also set `NAME` to the socket's path inside the sandbox (repeatable), such as HERMES_RPC_SOCKET"},
	{Name: "callback-conns", Kind: Int, Default: strconv.Itoa(wire.DefaultCallbackConns), Usage: "with --callback: forward at most `N` connections per call; later ones are closed at once"},
	{Name: "callback-bytes", Kind: Size, Default: DefaultCallbackBytes, Usage: "with --callback: forward at most `SIZE` in all for the call (both ways, all connections together); the connection that crosses it is cut"},
	{Name: "callback-idle", Kind: Duration, DefaultText: "none: a connection lasts as long as the call", Usage: "with --callback: cut a connection idle (no byte either way) for `DURATION`"},
}

// Build is a hash of the source the binary was built from, stamped by the
// Makefile (-ldflags -X), so that two builds of different sources differ in
// their build settings; empty in a plain go build.
var Build string
