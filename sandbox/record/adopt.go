package record

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/containerd/errdefs"
)

// Adoption is how an idle pooled sandbox is handed out: package sandbox's
// Acquire and the flmbox command's pooled run --image take one so, by
// Adopt and FromPool, the only code that does. The zero Adoption hands a
// sandbox out under its pool name, to no owner, without labels, and leaves
// one that cannot be handed out as it is.
type Adoption struct {
	// Owned makes this process the sandbox's owner (sandbox's
	// Spec.Ephemeral): killed, it leaves the sandbox to Reconcile.
	Owned bool
	// Labels are its holder's (copied).
	Labels map[string]string
	// Rename, if set, gives the sandbox its holder's name under its lock,
	// before its record is written (package sandbox's rename): the
	// directory moved, Name and Dir set. FromPool stops at a Rename that
	// fails with errdefs.ErrAlreadyExists: that name is taken.
	Rename func(*Record) error
	// Discard, if set, removes a sandbox that cannot be handed out (its
	// agent does not answer, or its record could not be written) under its
	// lock; without it, such a sandbox is left as it is, for a process that
	// can remove it.
	Discard func(context.Context, *Record)
	// Warn, if set, is told what FromPool passed over, and what Discard
	// removes.
	Warn func(error)
}

// errTaken is Adopt's failure when another process took the sandbox (or
// removed it) first, or its agent does not answer: FromPool tries the next
// one.
var errTaken = errors.New("taken")

// Adopt takes the idle pooled sandbox of rec for a's holder, in this order:
// its directory's lock, without waiting, and its record read again
// (LockIdle: still idle, not renamed); a ping of its agent (one that does
// not answer is discarded); this process made its owner if a.Owned; the
// holder's name (a.Rename); the record written with Pooled nil and the
// holder's labels (a sandbox whose record cannot be written is discarded);
// its last use marked. Adopt unlocks before it returns. It fails with an
// error that FromPool passes over when another process took the sandbox
// first or its agent does not answer.
func (a Adoption) Adopt(ctx context.Context, rec *Record) (_ *Record, err error) {
	rec, unlock := LockIdle(rec)
	if rec == nil {
		return nil, errTaken
	}
	defer unlock()
	if err := rec.Ping(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, err // the caller's end: the sandbox stays idle
		}
		if a.Discard != nil {
			a.warn(fmt.Errorf("removing idle sandbox %s of pool %s, whose agent does not answer: %w", rec.Name, rec.Shape, err))
			a.Discard(ctx, rec)
		}
		return nil, errTaken
	}
	rec.Pooled, rec.Owner, rec.Labels = nil, nil, maps.Clone(a.Labels)
	if a.Owned {
		if rec.Owner, err = Self(); err != nil {
			return nil, fmt.Errorf("acquire sandbox: %w", err)
		}
	}
	if a.Rename != nil {
		if err := a.Rename(rec); err != nil {
			return nil, err
		}
	}
	if err := Write(rec); err != nil {
		if a.Discard != nil {
			a.Discard(ctx, rec)
		}
		return nil, err
	}
	rec.Touch()
	return rec, nil
}

// FromPool adopts an idle sandbox of shape key in root (Idle: the most
// recently parked first) as Adopt does, passing over those another process
// took first, whose agent does not answer, or whose adoption failed
// otherwise (told to a.Warn). It returns the record of the sandbox adopted
// and whether it was the last one idle, or nil if it adopted none; its
// error is a.Rename's errdefs.ErrAlreadyExists, or ctx's end (the
// sandboxes not taken stay idle).
func (a Adoption) FromPool(ctx context.Context, root, key string) (_ *Record, last bool, err error) {
	idle := Idle(root, key)
	for i, rec := range idle {
		rec, err := a.Adopt(ctx, rec)
		switch {
		case errors.Is(err, errTaken):
			continue
		case errdefs.IsAlreadyExists(err) || ctx.Err() != nil:
			return nil, false, err
		case err != nil:
			a.warn(err)
			continue
		}
		return rec, i == len(idle)-1, nil
	}
	return nil, false, nil
}

func (a Adoption) warn(err error) {
	if a.Warn != nil {
		a.Warn(err)
	}
}
