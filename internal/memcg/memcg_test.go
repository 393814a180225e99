package memcg

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func TestChargedReadsTheOpenFileAgain(t *testing.T) {
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
	write("memory/v1/memory.usage_in_bytes", "22020096\n")
	write("v2/memory.current", "16048128\n")
	for _, tc := range []struct {
		id, file, inactive string
		want               int64
	}{
		{"v1", "memory/v1/memory.usage_in_bytes", "total_inactive_file", 22020096},
		{"v2", "v2/memory.current", "inactive_file", 16048128},
	} {
		c, err := OpenUnder(root, tc.id)
		if err != nil {
			t.Fatalf("OpenUnder(%q): %v", tc.id, err)
		}
		if c.InactiveKey() != tc.inactive || c.Dir() != filepath.Dir(filepath.Join(root, tc.file)) {
			t.Errorf("OpenUnder(%q): key %q, dir %s", tc.id, c.InactiveKey(), c.Dir())
		}
		for _, want := range []int64{tc.want, 123456789012, 4096} {
			if n, err := c.Read(); n != want || err != nil {
				t.Errorf("Read() of %s = %d, %v; want %d", tc.id, n, err, want)
			}
			// A shorter or longer figure is read whole: the file is read
			// again from its start.
			next := map[int64]string{tc.want: "123456789012\n", 123456789012: "4096\n"}[want]
			write(tc.file, next)
		}
		c.Close()
	}
	write("memory/bad/memory.usage_in_bytes", "max\n")
	if c, err := OpenUnder(root, "bad"); err != nil {
		t.Fatal(err)
	} else if _, err := c.Read(); err == nil {
		t.Error("Read() of max: no error")
	}
	for id, kind := range map[string]error{"none": errdefs.ErrNotFound, "../v1": errdefs.ErrInvalidArgument, "": errdefs.ErrInvalidArgument} {
		if _, err := OpenUnder(root, id); !errors.Is(err, kind) {
			t.Errorf("OpenUnder(%q) = %v; want %v", id, err, kind)
		}
	}
}
