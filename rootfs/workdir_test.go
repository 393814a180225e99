package rootfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func TestEnterable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree's owners")
	}
	tree := t.TempDir()
	mk := func(p string, mode os.FileMode) {
		if err := os.MkdirAll(filepath.Join(tree, p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(tree, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("app", 0o755)
	mk("secret", 0o700)
	mk("open/under-closed", 0o755)
	mk("searchonly", 0o711)
	mk("mine", 0o700)
	if err := os.Chown(filepath.Join(tree, "mine"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(tree, "open"), 0o700)
	if err := os.Symlink("/app", filepath.Join(tree, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/../../..", filepath.Join(tree, "out")); err != nil {
		t.Fatal(err)
	}
	for dir, ok := range map[string]bool{
		"/app": true, "/link": true, "/mine": true, "/": true, "/out": true, // "/out" leads to the tree's root, never out
		"/secret": false, "/open/under-closed": false, "/searchonly": false, "/missing": false, "app": false,
	} {
		err := Enterable(filepath.Clean(tree), dir, 65534, 65534)
		if (err == nil) != ok || err != nil && !errdefs.IsFailedPrecondition(err) {
			t.Errorf("Enterable(%s) = %v, want ok %v", dir, err, ok)
		}
	}
}
