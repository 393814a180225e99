package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// TestRemoveCgroups: the container's directory goes from every hierarchy
// (v1 controllers, and the root for cgroup v2 alone), other containers'
// stay, none at all is not an error, a directory that cannot go (a
// cgroup with a child) is reported, and no path but a container ID is
// taken.
func TestRemoveCgroups(t *testing.T) {
	root := t.TempDir()
	const id, other = "flmbox-0123456789abcdef01234567", "flmbox-other"
	for _, d := range []string{"memory/" + id, "cpu,cpuacct/" + id, "pids/" + other, id, "unified"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("cpu,cpuacct", filepath.Join(root, "cpu")); err != nil {
		t.Fatal(err)
	}
	if err := removeCgroupsUnder(root, id, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"memory/" + id, "cpu,cpuacct/" + id, id} {
		if _, err := os.Stat(filepath.Join(root, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: %v", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "pids", other)); err != nil {
		t.Errorf("another container's cgroup went: %v", err)
	}
	if err := removeCgroupsUnder(root, id, time.Second); err != nil {
		t.Errorf("again: %v", err)
	}

	if err := os.MkdirAll(filepath.Join(root, "memory", id, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := removeCgroupsUnder(root, id, time.Second); !errdefs.IsUnavailable(err) {
		t.Errorf("a cgroup that cannot be removed: %v, want an unavailable error", err)
	}

	for _, bad := range []string{"", ".", "..", "a/b", "../x"} {
		if err := removeCgroupsUnder(root, bad, time.Second); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ID %q: %v, want an invalid argument error", bad, err)
		}
	}
	if _, err := os.Stat(root); err != nil {
		t.Fatal(err)
	}
}
