// Package mountinfo reads this process's mount table
// (/proc/self/mountinfo).
package mountinfo

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one line of a mount table.
type Mount struct {
	Root  string // the mounted file system's directory at Point
	Point string // where it is mounted
	Type  string // its file system type ("" if the line has none)
	// SuperOptions are its file system's options, comma-separated (a
	// cgroup v1 hierarchy's controllers among them).
	SuperOptions string
}

// Parse reads a mount table in mountinfo's format (ID parent major:minor
// root mount-point options [optional...] - type source super-options),
// skipping lines it cannot read; fields are unescaped.
func Parse(table string) []Mount {
	var out []Mount
	for _, line := range strings.Split(table, "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		m := Mount{Root: Unescape(f[3]), Point: Unescape(f[4])}
		if g := strings.Fields(post); len(g) >= 3 {
			m.Type, m.SuperOptions = g[0], g[2]
		}
		out = append(out, m)
	}
	return out
}

// Read returns this process's mount table (/proc/self/mountinfo).
func Read() ([]Mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	return Parse(string(data)), nil
}

// Under returns the mount points at or below dir (made absolute, symlinks
// resolved), deepest first: the order to unmount them in. A point mounted
// several times is listed once per mount.
func Under(dir string) ([]string, error) {
	mounts, err := Read()
	if err != nil {
		return nil, err
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	var out []string
	for _, m := range mounts {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// Unescape decodes the octal escapes of a mountinfo field (\040 for a
// space, \134 for a backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// IsNsfs reports whether path is a namespace bound there (a mounted nsfs
// file, as ip netns add or runsc makes).
func IsNsfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}
