package sandbox

import (
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/sandbox/record"
)

// target is the sandbox a method acts on: by name (a Manager method's:
// whichever sandbox holds the name now), or by a handle's identity (its
// container and hand-out: the holding it was given with, and no other).
type target struct {
	name        string
	id, handOut string // a handle's; empty: by name
}

func named(name string) target { return target{name: name} }

// target is sb's identity: its methods never reach another sandbox, nor
// this one once it was given back and handed out again.
func (sb *Sandbox) target() target { return target{name: sb.Name, id: sb.ID, handOut: sb.handOut} }

// check fails, with errdefs.ErrNotFound, if rec (read by t's name) is not
// the holding t was handed out for: the sandbox was removed and another
// took its name, or it was released to its pool and acquired again.
func (t target) check(rec *record.Record) error {
	if t.id == "" || rec == nil || rec.ID == t.id && rec.HandOut == t.handOut {
		return nil
	}
	if rec.ID == t.id {
		return t.stale()
	}
	return fmt.Errorf("sandbox %q is container %s now; this handle's (container %s) was removed or released: %w",
		t.name, rec.ID, t.id, errdefs.ErrNotFound)
}

// stale is the error of a request the agent refused as of an ended holding
// (wire.Result.Stale).
func (t target) stale() error {
	return fmt.Errorf("sandbox %q: this handle's holding of it (container %s) ended: it was released and handed out again: %w",
		t.name, t.id, errdefs.ErrNotFound)
}
