//go:build integration

package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/testrig/flamesim"
)

// instanceWithin runs flmbox instance with FLAME_INSTANCE_ENDPOINT=endpoint
// and args, and fails the test if it runs longer than d: an instance that
// is refused its socket exits at once, one that serves runs until stopped.
func instanceWithin(t *testing.T, d time.Duration, root, endpoint string, args ...string) result {
	t.Helper()
	return flmboxWithinEnv(t, d, root, []string{flamesim.EndpointEnv + "=" + endpoint}, nil, append([]string{"instance"}, args...)...)
}

// refusedInOneLine checks that res is flmbox instance refused: exit 125,
// one line on stderr that holds want, never "serving".
func refusedInOneLine(t *testing.T, what string, res result, want string) {
	t.Helper()
	if res.code != 125 || strings.Count(res.stderr, "\n") != 1 || !strings.HasPrefix(res.stderr, "flmbox: ") ||
		!strings.Contains(res.stderr, want) || strings.Contains(res.stderr, "serving") {
		t.Errorf("%s: exit %d, stderr %q; want 125 and one line with %q", what, res.code, res.stderr, want)
	}
}

// inode is the inode of the file at path, 0 if there is none.
func inode(path string) uint64 {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestInstanceSocketInUse: a second flmbox instance on the endpoint of one
// that serves is refused in one line, before it says serving, and leaves
// the first's socket: the first still answers, after the second is gone.
// Once the first is killed (its socket left, stale), a third takes the
// endpoint.
func TestInstanceSocketInUse(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	first := startInstance(t, root)
	sock := first.sim.Socket()
	ino := inode(sock)

	res := instanceWithin(t, 30*time.Second, t.TempDir(), sock)
	refusedInOneLine(t, "a second instance on a live endpoint", res, "in use")

	if got := inode(sock); got != ino || ino == 0 {
		t.Errorf("the first instance's socket: inode %d, was %d", got, ino)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := first.sim.Leave(ctx); err != nil {
		t.Fatalf("the first instance no longer answers: %v\n%s", err, first.stderr)
	}

	// Killed, the first leaves its socket: stale, it is replaced.
	first.sim.Kill()
	if inode(sock) == 0 {
		t.Fatal("the killed instance's socket is gone: nothing stale to test")
	}
	third, err := flamesim.Start(ctx, flmboxBin, []string{"--root", root, "--runsc", runscPath, "instance"},
		flamesim.Options{Dir: filepath.Dir(sock)})
	if err != nil {
		t.Fatalf("an instance on a stale socket: %v", err)
	}
	defer third.Kill()
	if _, err := third.Leave(ctx); err != nil {
		t.Fatalf("the instance on the stale socket does not answer: %v", err)
	}
	if err := third.Stop(30 * time.Second); err != nil {
		t.Errorf("stop: %v", err)
	}
	if inode(sock) != 0 {
		t.Error("an instance that stopped left its socket")
	}
}

// TestInstanceSocketPaths: a path that is a regular file is refused and
// left as it was; so is a path too long for a Unix socket, saying the limit.
func TestInstanceSocketPaths(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "instance.sock")
	if err := os.WriteFile(file, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	res := instanceWithin(t, 30*time.Second, t.TempDir(), file)
	refusedInOneLine(t, "a regular file", res, "is not a socket (a regular file)")
	if b, err := os.ReadFile(file); err != nil || string(b) != "not a socket" {
		t.Errorf("the regular file: %q, %v", b, err)
	}

	long := filepath.Join(dir, strings.Repeat("d", 120-len(dir)-1))
	res = instanceWithin(t, 30*time.Second, t.TempDir(), long)
	refusedInOneLine(t, "a 120-byte path", res, "120 bytes, more than a Unix socket's 107")
	if _, err := os.Lstat(long); err == nil {
		t.Error("something was made at the long path")
	}
}
