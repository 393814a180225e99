// Package memcg reads what a runsc container's memory cgroup is charged,
// from a file kept open: one pread a read, a few microseconds of the host's
// time and none of the container's. A read of a sandbox's /proc/meminfo
// from inside costs the sandbox's own CPU, which its snippets would have
// had (docs/PERFORMANCE.md, "Long calls"). It is a leaf, light enough for
// the warm path (package record), and package runtime reads through it.
package memcg

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// Root is where runsc makes a container's cgroups, named after the
// container's ID (flmbox's specs have no cgroupsPath): Root/memory/ID under
// cgroup v1, Root/ID under cgroup v2 alone.
const Root = "/sys/fs/cgroup"

// Charged is the open file of what a container's memory cgroup is charged:
// cgroup v1's memory.usage_in_bytes, v2's memory.current (its processes'
// memory, gVisor's memory file too, page cache they read, kernel memory).
type Charged struct {
	f           *os.File
	dir         string
	inactiveKey string
	id          string
	buf         [32]byte
}

// Open opens what container id's memory cgroup under Root is charged.
// errdefs.ErrNotFound if it has none.
func Open(id string) (*Charged, error) { return OpenUnder(Root, id) }

// OpenUnder is Open of the cgroups under root.
func OpenUnder(root, id string) (*Charged, error) {
	if id == "" || filepath.Base(id) != id || id == "." || id == ".." {
		return nil, fmt.Errorf("memory of container %q: not a container ID: %w", id, errdefs.ErrInvalidArgument)
	}
	for _, c := range []struct{ dir, usage, inactive string }{
		{filepath.Join(root, "memory", id), "memory.usage_in_bytes", "total_inactive_file"},
		{filepath.Join(root, id), "memory.current", "inactive_file"},
	} {
		f, err := os.Open(filepath.Join(c.dir, c.usage))
		if err == nil {
			return &Charged{f: f, dir: c.dir, inactiveKey: c.inactive, id: id}, nil
		}
	}
	return nil, fmt.Errorf("memory of container %s: no memory cgroup under %s: %w", id, root, errdefs.ErrNotFound)
}

// Read returns what the cgroup is charged now, in bytes.
func (c *Charged) Read() (int64, error) {
	n, err := c.f.ReadAt(c.buf[:], 0)
	if err != nil && err != io.EOF {
		return 0, fmt.Errorf("memory of container %s: %w", c.id, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(c.buf[:n])), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory of container %s: %s: %w", c.id, filepath.Base(c.f.Name()), err)
	}
	return v, nil
}

// Dir is the cgroup's directory.
func (c *Charged) Dir() string { return c.dir }

// InactiveKey is the key, in the cgroup's memory.stat, of its inactive file
// cache, which the kernel reclaims first.
func (c *Charged) InactiveKey() string { return c.inactiveKey }

// Close closes the file.
func (c *Charged) Close() error { return c.f.Close() }
