package runcmd

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPoolHint(t *testing.T) {
	root := t.TempDir()
	key := PoolHintKey("img@sha256:1", "", "3-4", "1-2")
	for _, other := range []string{PoolHintKey("img@sha256:2", "", "3-4", "1-2"), PoolHintKey("img@sha256:1", "64MiB", "3-4", "1-2"), PoolHintKey("img@sha256:1", "", "3-5", "1-2"), PoolHintKey("img@sha256:1", "", "3-4", "1-3")} {
		if other == key {
			t.Fatalf("two command lines share the key %s", key)
		}
	}
	if got := ReadPoolHint(root, key); got != "" {
		t.Fatalf("no hint read as %q", got)
	}
	for _, shape := range []string{"0123456789abcdef", "fedcba9876543210"} {
		if err := WritePoolHint(root, key, shape); err != nil {
			t.Fatal(err)
		}
		if got := ReadPoolHint(root, key); got != shape {
			t.Fatalf("hint %q read as %q", shape, got)
		}
	}
	p := filepath.Join(root, "pool", "hints", key)
	if err := os.WriteFile(p, []byte("../x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := ReadPoolHint(root, key); got != "" {
		t.Fatalf("a hint holding a path read as %q", got)
	}
	if !PoolHintable("r@sha256:ab") || PoolHintable("python:3.12") {
		t.Fatal("PoolHintable: want digest references only")
	}
}
