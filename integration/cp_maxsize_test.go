//go:build integration

package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCpMaxSizeOnTheHost: a host file past --max-size fails the copy
// promptly, saying so, and nothing is written in the sandbox; so does a
// host tree that cannot be read whole.
func TestCpMaxSizeOnTheHost(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	host := t.TempDir()
	big := filepath.Join(host, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	shell(t, root, "s", "mkdir /tmp/in")
	res := cpWithin(t, 30*time.Second, root, nil, "--max-size", "1MiB", big, "s:/tmp/in/")
	if res.code != 125 || !bytes.Contains([]byte(res.stderr), []byte("over 1048576 bytes")) {
		t.Errorf("cp past --max-size: exit %d, stderr %q; want 125 and the bound", res.code, res.stderr)
	}
	if out := shell(t, root, "s", "ls -A /tmp/in | wc -l"); out != "0\n" {
		t.Errorf("a refused copy wrote in the sandbox: %q entries", out)
	}
	checkAlive(t, root, "s")
}
