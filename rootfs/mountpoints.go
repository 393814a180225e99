package rootfs

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// MountPointType is what a mount point is: a directory or a regular file.
type MountPointType string

// Mount point types.
const (
	// MountPointDir is a directory, the destination of a directory's bind
	// mount.
	MountPointDir MountPointType = "dir"
	// MountPointFile is an empty regular file, the destination of a file's
	// bind mount.
	MountPointFile MountPointType = "file"
)

// MountPoint is a path that a runtime mounts something on in every tree of
// a Store. A runtime that does not find it makes it in the tree itself (runsc's
// gofer does, in the host's directory, even for a read-only root), which
// would change a tree that every sandbox shares; so the Store makes it once,
// when it unpacks the image, and records it in the entry.
type MountPoint struct {
	// Path is the mount point's absolute, clean path in the tree, such as
	// "/dev/.flmbox/run". It is resolved in the tree as a layer's entries
	// are (symlinks of the image lead inside the tree); its last component
	// is never followed.
	Path string `json:"path"`
	// Type is MountPointDir or MountPointFile.
	Type MountPointType `json:"type"`
	// Optional says that an image which has the path as another type (a
	// symlink, say: /etc/resolv.conf often is one) keeps it: the point is
	// skipped, recorded as such (Image.Skipped), and the runtime mounts
	// nothing there. Without it, such an image fails with
	// errdefs.ErrFailedPrecondition.
	Optional bool `json:"optional,omitempty"`
}

// Moved is an optional mount point that the image has as a symlink to a
// file or directory in its own tree (a systemd-style /etc/resolv.conf): the
// mount point is made, or found, at the link's target, To, where a runtime
// mounts what it would mount at the point's path, so that the image's own
// link leads to it.
type Moved struct {
	MountPoint MountPoint `json:"mount_point"`
	To         string     `json:"to"`
}

// runtimeDirs are where a runtime mounts file systems of its own over the
// tree: a point moved below one would be hidden.
var runtimeDirs = []string{"/dev", "/proc", "/sys", "/tmp"}

func (mp MountPoint) String() string {
	if mp.Optional {
		return fmt.Sprintf("%s (%s, optional)", mp.Path, mp.Type)
	}
	return fmt.Sprintf("%s (%s)", mp.Path, mp.Type)
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithMountPoints gives every tree of the Store these mount points. A new
// entry gets them after its last layer, before it is published; an entry
// that lacks one (cached by an earlier flmbox, or made before it was asked
// for) gets it when Prewarm next returns the entry. Default: none.
func WithMountPoints(points ...MountPoint) StoreOption {
	return func(s *Store) { s.mountPoints = append(s.mountPoints, points...) }
}

// checkMountPoints validates points and returns them without duplicates,
// sorted by path (a parent before its children). A path named with two
// types, or below a file's mount point, fails with
// errdefs.ErrInvalidArgument.
func checkMountPoints(points []MountPoint) ([]MountPoint, error) {
	out := make([]MountPoint, 0, len(points))
	for _, mp := range points {
		if err := checkMountPoint(mp); err != nil {
			return nil, err
		}
		if i := slices.IndexFunc(out, func(o MountPoint) bool { return o.Path == mp.Path }); i >= 0 {
			if out[i].Type != mp.Type {
				return nil, fmt.Errorf("mount point %s is asked for both as a %s and as a %s: %w", mp.Path, out[i].Type, mp.Type, errdefs.ErrInvalidArgument)
			}
			out[i].Optional = out[i].Optional && mp.Optional // required if anyone requires it
			continue
		}
		out = append(out, mp)
	}
	slices.SortFunc(out, func(a, b MountPoint) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range out {
		if f.Type != MountPointFile {
			continue
		}
		for _, mp := range out {
			if strings.HasPrefix(mp.Path, f.Path+"/") {
				return nil, fmt.Errorf("mount point %s is below %s, a file's mount point: %w", mp.Path, f.Path, errdefs.ErrInvalidArgument)
			}
		}
	}
	return out, nil
}

func checkMountPoint(mp MountPoint) error {
	p := mp.Path
	switch {
	case mp.Type != MountPointDir && mp.Type != MountPointFile:
		return fmt.Errorf("mount point %q: type %q: want %q or %q: %w", p, mp.Type, MountPointDir, MountPointFile, errdefs.ErrInvalidArgument)
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/":
		return fmt.Errorf("mount point %q: want an absolute, clean path below /: %w", p, errdefs.ErrInvalidArgument)
	case len(p) > maxPathLen || strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("mount point %q: not a valid path: %w", p, errdefs.ErrInvalidArgument)
	}
	parts := strings.Split(p[1:], "/")
	if len(parts) > maxDepth {
		return fmt.Errorf("mount point %q: more than %d levels deep: %w", p, maxDepth, errdefs.ErrInvalidArgument)
	}
	for _, c := range parts {
		if len(c) > maxNameLen {
			return fmt.Errorf("mount point %q: a component is longer than %d bytes: %w", p, maxNameLen, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// requiredMountPoints are the mount points an entry of this pull must have:
// the Store's and the pull's own.
func (s *Store) requiredMountPoints(o *PullOptions) ([]MountPoint, error) {
	return checkMountPoints(slices.Concat(s.mountPoints, o.MountPoints))
}

// missingMountPoints returns the points that img's record lacks, neither
// made nor skipped.
func (img *Image) missingMountPoints(points []MountPoint) []MountPoint {
	var out []MountPoint
	for _, mp := range points {
		if !slices.Contains(img.MountPoints, mp) && !slices.Contains(img.Skipped, mp) &&
			!slices.ContainsFunc(img.Moved, func(m Moved) bool { return m.MountPoint == mp }) {
			out = append(out, mp)
		}
	}
	return out
}

// ensureMountPoints gives the published entry img (hex) the points its
// record lacks, under the entry's lock. It is the only change ever made to
// a published tree, and it is recorded.
func (s *Store) ensureMountPoints(ctx context.Context, hex string, img *Image, points []MountPoint) (*Image, error) {
	if len(img.missingMountPoints(points)) == 0 {
		return img, nil
	}
	unlock, err := s.lock(ctx, hex)
	if err != nil {
		return nil, err
	}
	defer unlock()
	img, err = s.get(hex) // as it is now that the lock is ours
	if err != nil {
		return nil, fmt.Errorf("image sha256:%s is not cached: %w", hex, ErrNotCached)
	}
	return s.addMountPoints(hex, img, points)
}

// addMountPoints makes the points that the record of the published entry
// img lacks in its tree, and records them and the paths it created in its
// image.json (a temporary file renamed over it). What it made before a
// failure is recorded too. The caller holds the entry's lock.
func (s *Store) addMountPoints(hex string, img *Image, points []MountPoint) (*Image, error) {
	missing := img.missingMountPoints(points)
	if len(missing) == 0 {
		return img, nil
	}
	p, err := prepareMountPoints(img.Rootfs, missing)
	if len(p.done) > 0 || len(p.skipped) > 0 || len(p.added) > 0 {
		rec := *img
		rec.MountPoints = slices.Concat(img.MountPoints, p.done)
		rec.Skipped = slices.Concat(img.Skipped, p.skipped)
		rec.Moved = slices.Concat(img.Moved, p.moved)
		rec.Added = slices.Concat(img.Added, p.added)
		if werr := writeJSONAtomic(filepath.Join(s.entryDir(hex), "image.json"), rec.stored()); werr != nil {
			return nil, fmt.Errorf("record the mount points of image %s: %w", img.ManifestDigest, werr)
		}
		img = &rec
	}
	if err != nil {
		return nil, fmt.Errorf("prepare the mount points of image %s: %w", img.ManifestDigest, err)
	}
	return img, nil
}

// stored returns img without the fields that image.json does not hold.
func (img Image) stored() *Image {
	img.Rootfs, img.LastUsed, img.Names, img.Holders = "", time.Time{}, nil, nil
	return &img
}
