package sandbox

import (
	"fmt"
	"os"
	"path"
	"slices"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/rootfs"
)

// mountPoints are the destinations of the bind mounts of every sandbox
// (specOpts) and of FetchWheels' sandbox. runsc's gofer makes a bind
// mount's missing destination in the host's directory of the root, even a
// read-only root and even below a tmpfs of the spec (/dev), which would
// change the cached tree that sandboxes share; so the image cache makes
// them once, when it unpacks an image, and records them
// (rootfs.WithMountPoints). The gofer then finds them and makes nothing.
var mountPoints = append([]rootfs.MountPoint{
	// The sandbox's tmpfs: an image whose /tmp is a file or a symlink is
	// refused when it is prewarmed, not at every create.
	{Path: "/tmp", Type: rootfs.MountPointDir},
	{Path: agentBinary, Type: rootfs.MountPointFile},
	{Path: agentRunDir, Type: rootfs.MountPointDir},
	{Path: pipcacheMount, Type: rootfs.MountPointDir},
	{Path: fetchMount, Type: rootfs.MountPointDir},
}, etcMountPoints...)

// pullOptions are spec.Pull with the mount points of spec.Mounts, which the
// cached tree gets (recorded) before runsc runs: a file for a source that
// is not a directory, as the gofer would make (following symlinks).
func pullOptions(spec Spec) (*rootfs.PullOptions, error) {
	if len(spec.Mounts) == 0 {
		return spec.Pull, nil
	}
	var o rootfs.PullOptions
	if spec.Pull != nil {
		o = *spec.Pull
	}
	o.MountPoints = slices.Clone(o.MountPoints)
	for _, mt := range spec.Mounts {
		fi, err := os.Stat(mt.Source)
		if err != nil {
			return nil, fmt.Errorf("mount %s at %s: %w: %w", mt.Source, mt.Destination, err, errdefs.ErrInvalidArgument)
		}
		mp := rootfs.MountPoint{Path: mt.Destination, Type: rootfs.MountPointDir}
		if path.IsAbs(mp.Path) {
			mp.Path = path.Clean(mp.Path) // a relative one is refused
		}
		if !fi.IsDir() {
			mp.Type = rootfs.MountPointFile
		}
		o.MountPoints = append(o.MountPoints, mp)
	}
	return &o, nil
}
