package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/internal/privilege"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// agentName is the sandboxes' agent binary, next to flmbox.
const agentName = "flmbox-agent"

// A pooled run: `flmbox run --image IMAGE` served from a warm pool.
//
// flmbox-core costs milliseconds to start (go-containerregistry, net/http,
// gRPC): more than a pooled sandbox's whole answer. So when flmbox-core has
// left a hint of this command line's shape (runcmd.PoolHintKey), the flmbox
// command takes an idle sandbox of that shape by package sandbox's Acquire's
// own code (record.Adoption: under its directory's lock, still idle, its
// agent answering; the record then names this process its owner, so that a
// kill leaves it to Reconcile), makes the call and prints its result, starts the pool's
// refill if it took the last one, and then execs flmbox-core to give the
// sandbox back (`pool return`: reset into its pool, or removed), which
// exits with the call's status as `run --image` does. Anything else (no
// hint, no idle sandbox, a request flmbox-core would refuse) is handed to
// flmbox-core before a sandbox is taken.

// giveBack is the `flmbox-core pool return` command line that gives back
// the sandbox a pooled run took and exits with its status.
type giveBack struct {
	name    string
	status  int
	message string // printed by flmbox-core after the sandbox is given back
	quiet   bool   // an interrupted call: its sandbox's failure to be given back is not said
}

// args is the command line, global flags first, as flmbox-core reads it.
func (w *warmCall) giveBackArgs(b giveBack) []string {
	args := append(w.globalArgs(), "pool", "return", "--status", strconv.Itoa(b.status))
	if b.message != "" {
		args = append(args, "--message", b.message)
	}
	if b.quiet {
		args = append(args, "--quiet")
	}
	return append(args, "--", b.name)
}

// globalArgs are flmbox-core's global flags for this command line.
func (w *warmCall) globalArgs() []string {
	args := []string{coreName, "--root", w.root}
	if w.runsc != "" {
		args = append(args, "--runsc", w.runsc)
	}
	return args
}

// runPooled makes the call in a sandbox taken from the pool of --image's
// shape and prints its result. ok is false, with nothing taken or printed,
// when flmbox-core must run the command line instead; once it is true the
// caller must exec flmbox-core with back's command line.
func (w *warmCall) runPooled(ctx context.Context, core string, stdout, stderr io.Writer) (back giveBack, ok bool) {
	req, ok := w.request()
	if !ok || privilege.Check("take a pooled sandbox") != nil {
		return back, false // flmbox-core says why
	}
	self, err := os.Executable()
	if err != nil {
		return back, false
	}
	agent, coreID := runcmd.FileID(filepath.Join(filepath.Dir(self), agentName)), runcmd.FileID(core)
	if agent == "" || coreID == "" {
		return back, false
	}
	shape := runcmd.ReadPoolHint(w.root, runcmd.PoolHintKey(w.image, w.tmpSize, coreID, agent))
	if shape == "" {
		return back, false
	}
	// As package sandbox's Acquire adopts for run --image (an ephemeral
	// sandbox under its pool name), but one it cannot hand out is left to
	// flmbox-core, which removes it: this binary runs no runsc.
	rec, last, err := record.Adoption{Owned: true}.FromPool(ctx, w.root, shape)
	if rec == nil || err != nil {
		return back, false
	}
	back.name = rec.Name
	back.status, back.message, back.quiet = w.call(ctx, rec, req, stdout, stderr)
	if last {
		w.refill(core, shape) // after the result: it would take CPU from the call
	}
	return back, true
}

// refill starts `flmbox-core pool refill SHAPE` in the background, as
// flmbox-core does when it takes a pool's last idle sandbox: a session of
// its own, no stdio.
func (w *warmCall) refill(core, shape string) {
	args := append(w.globalArgs(), "pool", "refill", shape)
	cmd := &exec.Cmd{Path: core, Args: args, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	cmd.Start() // as flmbox-core's: a refill that cannot start leaves the pool to the next one
}

// call makes the call in the sandbox of rec and prints its result as
// flmbox-core's run --image does, and returns the status, the message and
// whether a failure to give the sandbox back goes unsaid (the call was
// interrupted or failed), for flmbox-core to exit with once the sandbox is
// given back.
func (w *warmCall) call(ctx context.Context, rec *record.Record, req *wire.Request, stdout, stderr io.Writer) (code int, msg string, quiet bool) {
	res, err := rec.Call(ctx, req)
	switch {
	case errors.Is(err, wire.ErrInterrupted) || err != nil && ctx.Err() != nil:
		if !errors.Is(err, wire.ErrInterrupted) {
			res = nil // before the code ran, or with no answer from the agent
		}
		code, err := runcmd.PrintInterrupted(ctx, stdout, stderr, runcmd.FromWire(res), w.json)
		if err != nil {
			return runcmd.ExitFlmboxFailed, err.Error(), true
		}
		return code, "", true
	case err != nil:
		// As flmbox-core's run --image, which says the call's failure,
		// not the sandbox's to be given back.
		return runcmd.ExitFlmboxFailed, err.Error(), true
	}
	code, msg, err = runcmd.Print(stdout, stderr, runcmd.FromWire(res), w.json, w.timeout)
	if err != nil {
		return runcmd.ExitFlmboxFailed, err.Error(), false
	}
	return code, msg, false
}

// execArgs replaces this process with flmbox-core at core and args; it
// returns only on failure.
func execArgs(core string, args []string) error {
	err := syscall.Exec(core, args, os.Environ())
	return fmt.Errorf("run %s: %w; install flmbox, flmbox-core and flmbox-agent in one directory (make build puts them in bin/)", core, err)
}
