package sandbox

import (
	"context"
	"io"

	"github.com/flmbox/flmbox/sandbox/record"
)

// Caller runs code in a sandbox; *Sandbox is one. A program that only
// calls sandboxes can take a Caller and fake it in its own tests.
type Caller interface {
	Call(ctx context.Context, req Request) (*Result, error)
}

var _ Caller = (*Sandbox)(nil)

// A handle is bound to the holding of the sandbox it was handed out with
// (Create, Acquire, Get): once the sandbox is removed, or released to its
// pool and handed out again (under the same name or another), or another
// sandbox took its name, each of its methods fails with errdefs.ErrNotFound
// and changes nothing. Its fields are what was read when it was handed out.
// The Manager's methods by name act on whichever sandbox holds the name.

// Info reads the sandbox afresh, as Get does: a new handle of the same
// holding, whose fields are as they are now.
func (sb *Sandbox) Info(ctx context.Context) (*Sandbox, error) {
	rec, err := record.Read(sb.m.root, sb.Name)
	if err == nil {
		err = sb.target().check(rec)
	}
	if err != nil {
		return nil, err
	}
	return sb.m.described(rec), nil
}

// Call runs req in the sandbox (Manager.Call).
func (sb *Sandbox) Call(ctx context.Context, req Request) (*Result, error) {
	return sb.m.call(ctx, sb.target(), req)
}

// Reset returns the sandbox to a clean state, once its calls have finished
// (Manager.Reset).
func (sb *Sandbox) Reset(ctx context.Context) error { return sb.m.reset(ctx, sb.target()) }

// CopyIn extracts the tar stream r into the sandbox at dst (Manager.CopyIn).
func (sb *Sandbox) CopyIn(ctx context.Context, dst string, r io.Reader, o CopyOptions) error {
	return sb.m.copyInTo(ctx, sb.target(), dst, r, o)
}

// CopyOut returns src of the sandbox as a tar stream (Manager.CopyOut).
func (sb *Sandbox) CopyOut(ctx context.Context, src string, o CopyOptions) (io.ReadCloser, error) {
	return sb.m.copyOutOf(ctx, sb.target(), src, o)
}

// Suspend saves the sandbox to disk and stops it (Manager.Suspend).
func (sb *Sandbox) Suspend(ctx context.Context) error { return sb.m.suspend(ctx, sb.target()) }

// Resume brings a suspended sandbox back (Manager.Resume).
func (sb *Sandbox) Resume(ctx context.Context) (resumed bool, err error) {
	return sb.m.resume(ctx, sb.target())
}

// Release gives an acquired sandbox back to its pool (Manager.Release).
func (sb *Sandbox) Release(ctx context.Context) error { return sb.m.release(ctx, sb.target()) }

// Remove stops the sandbox and removes everything it is made of
// (Manager.Remove).
func (sb *Sandbox) Remove(ctx context.Context) error { return sb.m.remove(ctx, sb.target()) }
