package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/rootfs"
)

// TestPullOptionsHaveTheMountsDestinations: a Spec's mounts become mount
// points of its pull, typed by their sources as runsc's gofer types them,
// without changing the caller's PullOptions.
func TestPullOptionsHaveTheMountsDestinations(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	caller := &rootfs.PullOptions{Jobs: 2, MountPoints: []rootfs.MountPoint{{Path: "/x", Type: rootfs.MountPointDir}}}
	spec := Spec{Image: "img", Pull: caller, Mounts: []Mount{
		{Source: dir, Destination: "/mnt/data/"}, {Source: file, Destination: "/etc/f"}, {Source: link, Destination: "/mnt/link"},
	}}
	o, err := pullOptions(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := []rootfs.MountPoint{{Path: "/x", Type: rootfs.MountPointDir}, {Path: "/mnt/data", Type: rootfs.MountPointDir},
		{Path: "/etc/f", Type: rootfs.MountPointFile}, {Path: "/mnt/link", Type: rootfs.MountPointDir}}
	if o.Jobs != 2 || !slices.Equal(o.MountPoints, want) {
		t.Errorf("pull options %+v, want Jobs 2 and mount points %v", o, want)
	}
	if len(caller.MountPoints) != 1 {
		t.Errorf("the caller's options changed: %v", caller.MountPoints)
	}
	if o, err := pullOptions(Spec{Image: "img", Pull: caller}); err != nil || o != caller {
		t.Errorf("without mounts: %p %v, want the caller's options", o, err)
	}
	_, err = pullOptions(Spec{Image: "img", Mounts: []Mount{{Source: filepath.Join(dir, "missing"), Destination: "/m"}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing source: %v", err)
	}
}
