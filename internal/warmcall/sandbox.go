// Package warmcall is what flmbox run --sandbox does on the host, shared by
// the flmbox command, which makes warm calls itself, and flmbox-core, which
// implements every command: find a sandbox's agent, bound the snippet, and
// print the result as the user sees it. It imports nothing heavier than
// package wire, so that flmbox starts in about a millisecond.
package warmcall

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/flmbox/flmbox/internal/names"
	"github.com/flmbox/flmbox/snippet/wire"
)

// DefaultRoot is the state root when neither --root nor FLMBOX_ROOT names
// one.
const DefaultRoot = "/var/lib/flmbox"

// HungUpEnv is set, to the error, in the environment of flmbox-core when
// flmbox hands it a call whose agent hung up without answering: flmbox-core
// then explains the failure (a dead sandbox) without sending the request
// again, since the agent may have run it.
const HungUpEnv = "FLMBOX_INTERNAL_HUNG_UP"

// Sandbox is what a call needs of a sandbox's record, which package runtime
// writes (runtime.Sandbox in ROOT/sandboxes/NAME/sandbox.json).
type Sandbox struct {
	// Dir is the sandbox's directory, ROOT/sandboxes/NAME.
	Dir    string `json:"-"`
	Limits struct {
		MemoryBytes int64 `json:"memory_bytes"`
		Pids        int64 `json:"pids"`
	} `json:"limits"`
}

// Open reads the record of the sandbox name under the state root. Its errors
// are terse: flmbox hands a call that fails here to flmbox-core, which says
// what is wrong and what to do.
func Open(root, name string) (*Sandbox, error) {
	if !names.Valid(name, 64) {
		return nil, fmt.Errorf("sandbox name %q is not valid", name)
	}
	dir := filepath.Join(root, "sandboxes", name)
	b, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if err != nil {
		return nil, err
	}
	sb := &Sandbox{Dir: dir}
	if err := json.Unmarshal(b, sb); err != nil {
		return nil, fmt.Errorf("read sandbox %q: %w", name, err)
	}
	return sb, nil
}

// SocketPath is the agent's socket: DIR/run/agent.sock, where run is the
// directory bind-mounted into the sandbox (runtime.Sandbox.RunPath).
func SocketPath(dir string) string { return filepath.Join(dir, "run", "agent.sock") }

// SnippetLimits bounds a snippet's own process well inside its sandbox's
// cgroup limits (memory in bytes, pids), so that a runaway snippet fails
// alone and the sandbox lives.
func SnippetLimits(memoryBytes, pids int64) wire.Limits {
	return wire.Limits{MemoryBytes: memoryBytes / 2, Procs: pids / 4}
}

// Touch records that the sandbox in dir was just used (flmbox sandbox ls
// shows it as last used).
func Touch(dir string) {
	p := filepath.Join(dir, "last-used")
	now := time.Now()
	if err := os.Chtimes(p, now, now); errors.Is(err, os.ErrNotExist) {
		os.WriteFile(p, nil, 0o600)
	}
}
