package rootfs

import (
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// Defaults for UnpackOptions.
const (
	// DefaultMaxBytes bounds the uncompressed tar bytes of all layers of one
	// image together: 16 GiB.
	DefaultMaxBytes int64 = 16 << 30
	// DefaultMaxEntries bounds the tar entries of all layers together.
	DefaultMaxEntries int64 = 4_000_000
)

// Limits of names inside a layer (Linux NAME_MAX and PATH_MAX).
const (
	maxNameLen = 255
	maxPathLen = 4096
	maxDepth   = 256 // path components
)

// UnpackOptions tune an Unpacker. The zero value is valid.
type UnpackOptions struct {
	// MaxBytes bounds the uncompressed bytes read from all layers together,
	// tar headers and trailing padding included. Default DefaultMaxBytes.
	MaxBytes int64
	// MaxEntries bounds the number of tar entries of all layers together.
	// Default DefaultMaxEntries.
	MaxEntries int64
	// IgnoreOwner skips chown. It is forced on when the process is not root,
	// which is how unit tests run; files are then owned by the caller.
	IgnoreOwner bool
	// Warnf receives warnings (skipped device nodes, ignored aufs metadata).
	// Default: discard.
	Warnf func(format string, args ...any)
}

func (o *UnpackOptions) withDefaults() UnpackOptions {
	var out UnpackOptions
	if o != nil {
		out = *o
	}
	if out.MaxBytes <= 0 {
		out.MaxBytes = DefaultMaxBytes
	}
	if out.MaxEntries <= 0 {
		out.MaxEntries = DefaultMaxEntries
	}
	if os.Geteuid() != 0 {
		out.IgnoreOwner = true
	}
	if out.Warnf == nil {
		out.Warnf = func(string, ...any) {}
	}
	return out
}

// cleanName turns a tar entry name into a path relative to the tree's root,
// "" being the root itself. Absolute names and names that climb out with ".."
// are confined to the tree, as containerd does: "/etc/x" and "../../etc/x"
// both become "etc/x". Names that no file system could hold are refused.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", errUnsafe("empty entry name")
	}
	if len(name) > maxPathLen {
		return "", errUnsafe("entry name of %d bytes is longer than %d", len(name), maxPathLen)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", errUnsafe("entry name %q contains a NUL byte", name)
	}
	p := strings.TrimPrefix(path.Clean("/"+name), "/")
	parts := strings.Split(p, "/")
	if len(parts) > maxDepth {
		return "", errUnsafe("entry name is %d directories deep, more than %d", len(parts), maxDepth)
	}
	for _, c := range parts {
		if len(c) > maxNameLen {
			return "", errUnsafe("entry name %q has a component longer than %d bytes", name, maxNameLen)
		}
	}
	return p, nil
}

// cleanLinkTarget turns a hardlink's target into a path relative to the
// tree's root. Hardlink targets name entries of the archive, so a target that
// climbs out of the archive with ".." is refused rather than confined.
func cleanLinkTarget(name string) (string, error) {
	if name == "" {
		return "", errUnsafe("hardlink with an empty target")
	}
	if strings.IndexByte(name, 0) >= 0 || len(name) > maxPathLen {
		return "", errUnsafe("hardlink target %q is not a valid name", name)
	}
	p := path.Clean(strings.TrimLeft(name, "/"))
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", errUnsafe("hardlink target %q is outside the image", name)
	}
	if p == "." {
		return "", errUnsafe("hardlink target %q is the image root", name)
	}
	return p, nil
}

// Whiteout names (OCI image spec, layer filesystem changeset).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Bounds of the times written to the tree. Times outside are clamped.
var (
	minTime = time.Unix(0, 0)
	maxTime = time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC)
)

func clampTime(t time.Time) time.Time {
	switch {
	case t.IsZero() || t.Before(minTime):
		return minTime
	case t.After(maxTime):
		return maxTime
	}
	return t
}

// limitReader counts the bytes read from a layer against the unpacker's
// remaining budget and fails once the budget is spent.
type limitReader struct {
	r         io.Reader
	remaining *int64
	limit     int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if *l.remaining <= 0 {
		// Allow a read that finds EOF at exactly the limit.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			return 0, &LimitError{What: "uncompressed bytes", Limit: l.limit}
		}
		return 0, err
	}
	if int64(len(p)) > *l.remaining {
		p = p[:*l.remaining]
	}
	n, err := l.r.Read(p)
	*l.remaining -= int64(n)
	return n, err
}

// typeName names a tar type flag for error messages.
func typeName(t byte) string {
	switch t {
	case 'x', 'g':
		return "PAX header"
	case '3':
		return "character device"
	case '4':
		return "block device"
	case '6':
		return "FIFO"
	}
	return fmt.Sprintf("type %q", t)
}
