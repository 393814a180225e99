package sandbox

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
)

// hostOnly are host trees no sandbox may have: the kernel's (/proc, /sys)
// and the devices (/dev). A path under them is refused too: /proc/1/root is
// the host's root, /dev/sda its disk.
var hostOnly = []string{"/proc", "/sys", "/dev"}

// checkMounts refuses a mount whose source would hand a sandbox the host:
// its root, a tree of hostOnly, the state root (its sandboxes' sockets and
// checkpoints, the image cache every sandbox runs), anything inside it or a
// directory that holds it. Sources are judged as given and with their
// symlinks resolved. A source must be absolute.
func checkMounts(mounts []Mount, root string) error {
	var roots []string
	if root != "" {
		if abs, err := filepath.Abs(root); err == nil {
			roots = append(roots, abs)
			if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
				roots = append(roots, real)
			}
		}
	}
	for i, mt := range mounts {
		if !filepath.IsAbs(mt.Source) {
			return fmt.Errorf("mount %d: source %q: want an absolute host path: %w", i, mt.Source, errdefs.ErrInvalidArgument)
		}
		paths := []string{filepath.Clean(mt.Source)}
		if real, err := filepath.EvalSymlinks(mt.Source); err == nil && real != paths[0] {
			paths = append(paths, real)
		}
		for _, p := range paths {
			if why := refusedSource(p, roots); why != "" {
				return fmt.Errorf("mount %d: source %s: %s: %w", i, mt.Source, why, errdefs.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// refusedSource says why a sandbox may not have the host path p (clean,
// absolute), or "".
func refusedSource(p string, roots []string) string {
	if p == "/" {
		return "the host's root"
	}
	for _, h := range hostOnly {
		if within(p, h) {
			return "the host's " + h + " is not for sandboxes"
		}
	}
	for _, r := range roots {
		switch {
		case within(p, r):
			return "inside flmbox's state root " + r
		case within(r, p):
			return "it holds flmbox's state root " + r
		}
	}
	return ""
}

// within says whether path p is dir or under it (both clean).
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}
