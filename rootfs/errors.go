package rootfs

import (
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
)

// DigestMismatchError reports content whose digest is not the one it was
// named by. It matches errdefs.ErrFailedPrecondition with errors.Is.
type DigestMismatchError struct {
	// What names the content: "manifest", "config", "layer 2 (sha256:…)".
	What string
	// Kind is the digest checked: "digest" (compressed bytes) or "diff_id"
	// (uncompressed layer tar).
	Kind string
	// Expected is the digest the image declares; Actual the one computed.
	Expected, Actual string
}

func (e *DigestMismatchError) Error() string {
	return fmt.Sprintf("verify %s: %s mismatch: expected %s, content has %s; the registry or layout serves corrupt or tampered data",
		e.What, e.Kind, e.Expected, e.Actual)
}

// Is makes a DigestMismatchError match errdefs.ErrFailedPrecondition.
func (e *DigestMismatchError) Is(target error) bool {
	return target == errdefs.ErrFailedPrecondition
}

// LimitError reports an image that exceeds an unpacking limit: a possible
// decompression bomb. It matches errdefs.ErrResourceExhausted.
type LimitError struct {
	// What is the limited quantity: "uncompressed bytes" or "entries".
	What string
	// Limit is the configured bound.
	Limit int64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("image exceeds the limit of %d %s", e.Limit, e.What)
}

// Is makes a LimitError match errdefs.ErrResourceExhausted.
func (e *LimitError) Is(target error) bool {
	return target == errdefs.ErrResourceExhausted
}

// PlainHTTPError reports a plain-HTTP request to a registry that is neither
// a loopback address nor one of PullOptions.InsecureRegistries. It matches
// errdefs.ErrPermissionDenied.
type PlainHTTPError struct {
	// Host is the registry's host[:port], as InsecureRegistries names it.
	Host string
}

func (e *PlainHTTPError) Error() string {
	return fmt.Sprintf("refusing plain HTTP to %s: only loopback registries may use HTTP", e.Host)
}

// Is makes a PlainHTTPError match errdefs.ErrPermissionDenied.
func (e *PlainHTTPError) Is(target error) bool {
	return target == errdefs.ErrPermissionDenied
}

// Sentinels for callers that must tell these errors apart from others of
// their kind; errors.Is matches each of them and its kind.
var (
	// ErrNotCached reports an image that is not in the cache where the
	// network may not be used: Store.Get, or Prewarm with
	// PullOptions.Offline (a digest never prewarmed for the platform, or a
	// tag or layout never resolved on this machine). It matches
	// errdefs.ErrNotFound.
	ErrNotCached = errkind.Of(errdefs.ErrNotFound)
	// ErrPlatformNotFound reports an image with nothing for the platform
	// asked for: an index without it, or a platform manifest (named by its
	// digest) for another platform. It matches errdefs.ErrNotFound.
	ErrPlatformNotFound = errkind.Of(errdefs.ErrNotFound)
	// ErrInUse reports an image that sandboxes hold a lease on, which
	// Store.Remove refuses. It matches errdefs.ErrFailedPrecondition.
	ErrInUse = errkind.Of(errdefs.ErrFailedPrecondition)
)

// errUnsafe wraps errdefs.ErrInvalidArgument for layer entries that are
// refused because applying them could not be done safely or exactly.
func errUnsafe(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}
