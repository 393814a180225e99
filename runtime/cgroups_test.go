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

func TestContainerMemory(t *testing.T) {
	root := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// cgroup v1, as this VM's runsc makes them; v2 alone.
	write("memory/v1/memory.usage_in_bytes", "22020096\n")
	write("memory/v1/memory.stat", "cache 5705728\nrss 13803520\ninactive_file 99\ntotal_inactive_file 8192\n")
	write("v2/memory.current", "16048128\n")
	write("v2/memory.stat", "anon 12853248\nfile 1409024\ninactive_file 1048576\n")
	write("memory/nostat/memory.usage_in_bytes", "4096\n")
	for _, tc := range []struct {
		id   string
		want Memory
		kind error
	}{
		{"v1", Memory{22020096, 8192}, nil},
		{"v2", Memory{16048128, 1048576}, nil},
		{"nostat", Memory{4096, 0}, nil},
		{"none", Memory{}, errdefs.ErrNotFound},
		{"../v1", Memory{}, errdefs.ErrInvalidArgument},
		{"", Memory{}, errdefs.ErrInvalidArgument},
	} {
		got, err := containerMemoryUnder(root, tc.id)
		if got != tc.want || (tc.kind == nil) != (err == nil) || tc.kind != nil && !errors.Is(err, tc.kind) {
			t.Errorf("containerMemoryUnder(%q) = %+v, %v; want %+v, %v", tc.id, got, err, tc.want, tc.kind)
		}
	}
}
