package rootfs

import (
	"fmt"

	"github.com/containerd/errdefs"
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
	advice := "if the image is trusted, raise the limit (--max-unpacked-size)"
	if e.What == "entries" {
		advice = "the image has more files than flmbox unpacks (UnpackOptions.MaxEntries)"
	}
	return fmt.Sprintf("image exceeds the limit of %d %s; %s", e.Limit, e.What, advice)
}

// Is makes a LimitError match errdefs.ErrResourceExhausted.
func (e *LimitError) Is(target error) bool {
	return target == errdefs.ErrResourceExhausted
}

// errUnsafe wraps errdefs.ErrInvalidArgument for layer entries that are
// refused because applying them could not be done safely or exactly.
func errUnsafe(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}
