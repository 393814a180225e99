package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/sandbox"
)

func TestHint(t *testing.T) {
	_, missingRunsc := sandbox.LookupRunsc(context.Background(), filepath.Join(t.TempDir(), "runsc"))
	_, dirRunsc := sandbox.LookupRunsc(context.Background(), t.TempDir())
	store, err := rootfs.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, tagNotCached := store.Get("registry.example/py:3", rootfs.Platform{OS: "linux", Architecture: "amd64"})
	wrap := func(err error) error { return fmt.Errorf("create sandbox sb: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"runsc named but missing", missingRunsc, "install runsc with make runsc, or name it with --runsc or FLMBOX_RUNSC"},
		{"runsc not on PATH", fmt.Errorf("runsc is not on PATH: %w", sandbox.ErrRunscNotFound), "install runsc with make runsc, or name it with --runsc or FLMBOX_RUNSC"},
		{"runsc not executable", dirRunsc, "fix --runsc or FLMBOX_RUNSC"},
		{"runsc hangs", fmt.Errorf("remove sandbox s: %w", &sandbox.RunscTimeoutError{Command: "kill", Bound: time.Second}), "flmbox doctor checks this host; flmbox sandbox ls cleans up what is left"},
		{"platform unsupported", fmt.Errorf("create: %w", sandbox.ErrPlatformUnsupported), "choose --gvisor-platform systrap or ptrace; flmbox doctor lists this host's platforms"},
		{"tmp full", fmt.Errorf("copy into sandbox s: %w", sandbox.ErrTmpFull), "free space in its /tmp, or make a sandbox with a larger one (flmbox sandbox create --tmp-size)"},
		{"checkpoint damaged", fmt.Errorf("restore sandbox \"s\": %w", sandbox.ErrCheckpointDamaged), "no resume can bring it back: remove the sandbox (flmbox sandbox rm)"},
		{"runsc not found, wrapped", wrap(missingRunsc), "install runsc with make runsc, or name it with --runsc or FLMBOX_RUNSC"},
		{"image not cached", fmt.Errorf("image x for linux/amd64 is not cached: %w", rootfs.ErrNotCached), "run flmbox prewarm without --offline to fetch it"},
		{"tag never resolved, wrapped", wrap(tagNotCached), "run flmbox prewarm without --offline to fetch it"},
		{"no image for the platform", fmt.Errorf("resolve x: the index has no image for linux/s390x (it has linux/amd64): %w", rootfs.ErrPlatformNotFound), "choose the platform with --platform"},
		{"image in use", fmt.Errorf("image sha256:ab is used by sb: %w", rootfs.ErrInUse), "remove those sandboxes first (flmbox sandbox rm)"},
		{"plain HTTP", fmt.Errorf("resolve 10.0.0.1:5000/py:3: %w", &rootfs.PlainHTTPError{Host: "10.0.0.1:5000"}), "pass --insecure-registry 10.0.0.1:5000 if you trust the network"},
		{"uncompressed size limit", wrap(&rootfs.LimitError{What: "uncompressed bytes", Limit: 1}), "if the image is trusted, raise the limit with --max-unpacked-size"},
		{"compressed size limit", &rootfs.LimitError{What: "compressed bytes", Limit: 1}, "if the image is trusted, raise the limit with --max-unpacked-size"},
		{"entries limit", &rootfs.LimitError{What: "entries", Limit: 1}, "the image has more files than flmbox unpacks (UnpackOptions.MaxEntries)"},
		{"wheel conflict", fmt.Errorf("%w; nothing was imported", &pipcache.ConflictError{Filename: "hello-1.0-py3-none-any.whl", Name: "hello", Version: "1.0"}), "remove it first (flmbox pipcache rm hello==1.0)"},
		// Errors of the same kinds but without a sentinel get no hint: the
		// kind alone does not say what to do.
		{"a bare not found", fmt.Errorf("no sandbox %q: %w", "sb", errdefs.ErrNotFound), ""},
		{"a bare failed precondition", &rootfs.DigestMismatchError{What: "manifest", Kind: "digest"}, ""},
		{"a bare already exists", fmt.Errorf("image x is already leased by sb: %w", errdefs.ErrAlreadyExists), ""},
		{"a bare permission denied", fmt.Errorf("open x: %w", errdefs.ErrPermissionDenied), ""},
		{"an error without a kind", errors.New("boom"), ""},
		{"no error", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil && tc.name != "no error" {
				t.Fatal("the library returned no error")
			}
			if got := hint(tc.err); got != tc.want {
				t.Errorf("hint(%q) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}
