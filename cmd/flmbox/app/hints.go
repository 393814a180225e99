package app

import (
	"errors"

	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/sandbox"
)

// hint returns what a person should do next about err, for Run to print
// after the error, or "" when there is nothing to add. The libraries say
// what failed and carry errdefs kinds and sentinels (a gRPC front maps the
// same errors to its status codes); the commands and flags to use are the
// CLI's, chosen here by sentinel or type, never by the message's words.
func hint(err error) string {
	var (
		hung     *sandbox.RunscTimeoutError
		limit    *rootfs.LimitError
		plain    *rootfs.PlainHTTPError
		conflict *pipcache.ConflictError
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, sandbox.ErrRunscNotFound):
		return "install runsc with make runsc, or name it with --runsc or FLMBOX_RUNSC"
	case errors.Is(err, sandbox.ErrRunscNotExecutable):
		return "fix --runsc or FLMBOX_RUNSC"
	case errors.As(err, &hung):
		return "flmbox doctor checks this host; flmbox sandbox ls cleans up what is left"
	case errors.Is(err, sandbox.ErrPlatformUnsupported):
		return "choose --gvisor-platform systrap or ptrace; flmbox doctor lists this host's platforms"
	case errors.Is(err, sandbox.ErrTmpFull):
		return "free space in its /tmp, or make a sandbox with a larger one (flmbox sandbox create --tmp-size)"
	case errors.Is(err, sandbox.ErrCheckpointDamaged):
		return "no resume can bring it back: remove the sandbox (flmbox sandbox rm)"
	case errors.Is(err, rootfs.ErrNotCached):
		return "run flmbox prewarm without --offline to fetch it"
	case errors.Is(err, rootfs.ErrPlatformNotFound):
		return "choose the platform with --platform"
	case errors.Is(err, rootfs.ErrInUse):
		return "remove those sandboxes first (flmbox sandbox rm)"
	case errors.As(err, &plain):
		return "pass --insecure-registry " + plain.Host + " if you trust the network"
	case errors.As(err, &limit):
		if limit.What == "entries" {
			return "the image has more files than flmbox unpacks (UnpackOptions.MaxEntries)"
		}
		return "if the image is trusted, raise the limit with --max-unpacked-size"
	case errors.As(err, &conflict):
		return "remove it first (flmbox pipcache rm " + conflict.Name + "==" + conflict.Version + ")"
	}
	return ""
}
