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
	"strings"
	"syscall"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
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
// command takes an idle sandbox of that shape as package sandbox's Acquire
// does (under its directory's lock: still idle, its agent answering; the
// record then names this process its owner, so that a kill leaves it to
// Reconcile), makes the call and prints its result, starts the pool's
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
	if !ok || os.Geteuid() != 0 || !hasSysAdmin() {
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
	rec, last := w.adopt(ctx, shape)
	if rec == nil {
		return back, false
	}
	back.name = rec.Name
	back.status, back.message, back.quiet = w.call(ctx, rec, req, stdout, stderr)
	if last {
		w.refill(core, shape) // after the result: it would take CPU from the call
	}
	return back, true
}

// adopt takes an idle sandbox of shape, the most recently parked first, as
// package sandbox's adopt does, and says whether it was the last one; nil
// if it could take none (flmbox-core then removes those whose agent does
// not answer, or makes a sandbox).
func (w *warmCall) adopt(ctx context.Context, shape string) (_ *record.Record, last bool) {
	idle := record.Idle(w.root, shape)
	for i, rec := range idle {
		if took := takeIdle(ctx, rec); took != nil {
			return took, i == len(idle)-1
		}
	}
	return nil, false
}

// takeIdle takes the idle pooled sandbox of rec under its lock: nil if
// another process took it first, or its agent does not answer.
func takeIdle(ctx context.Context, rec *record.Record) *record.Record {
	rec, unlock := record.LockIdle(rec)
	if rec == nil {
		return nil
	}
	defer unlock()
	if rec.Ping(ctx) != nil {
		return nil
	}
	owner, err := record.Self()
	if err != nil {
		return nil
	}
	rec.Pooled, rec.Owner = nil, owner
	if record.Write(rec) != nil {
		return nil // the record is as it was: still idle
	}
	return rec // its call marks its last use
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

// hasSysAdmin says whether this process has CAP_SYS_ADMIN, which
// flmbox-core requires of whoever takes a sandbox.
func hasSysAdmin() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<21) != 0
		}
	}
	return false
}

// execArgs replaces this process with flmbox-core at core and args; it
// returns only on failure.
func execArgs(core string, args []string) error {
	err := syscall.Exec(core, args, os.Environ())
	return fmt.Errorf("run %s: %w; install flmbox, flmbox-core and flmbox-agent in one directory (make build puts them in bin/)", core, err)
}
