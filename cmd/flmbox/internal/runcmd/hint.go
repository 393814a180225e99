package runcmd

import (
	"errors"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// CallHint is what a person can do about err, the failure of a call to
// sandbox name, or "" if there is nothing to say. Both binaries print it
// after the error.
func CallHint(err error, name string) string {
	switch {
	case errors.Is(err, record.ErrRemoved):
		return "create it again with flmbox sandbox create --name " + name
	case errors.Is(err, record.ErrUnresponsive):
		return "its gVisor sandbox may be stopped or starved of CPU; flmbox sandbox ls shows its state, flmbox sandbox rm " + name + " removes it"
	case errors.Is(err, record.ErrDead):
		return "remove it with flmbox sandbox rm " + name + " and create another"
	case errors.Is(err, wire.ErrProtocolVersion):
		return "recreate it with this flmbox: flmbox sandbox rm " + name + ", then flmbox sandbox create"
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return "a snippet may have replaced the agent's socket: remove the sandbox with flmbox sandbox rm " + name
	case errors.Is(err, wire.ErrHungUp), errdefs.IsDeadlineExceeded(err):
		return "flmbox sandbox ls shows its state"
	case errdefs.IsNotFound(err):
		return "flmbox sandbox ls lists the sandboxes; flmbox sandbox create makes one"
	case errors.Is(err, record.ErrPooled):
		return "take a clean sandbox of its pool with flmbox run --image or flmbox sandbox create --image; flmbox pool drain empties the pool"
	case errdefs.IsFailedPrecondition(err):
		return "wait until it is created, or remove it with flmbox sandbox rm " + name
	}
	return ""
}
