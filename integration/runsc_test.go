//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/runtime"
)

// TestCachedRootfsRunsUnderRunsc runs the real runsc on a rootfs that
// prewarm unpacked, with the spec flmbox generates: Python starts, runs as
// 65534, can write /tmp but not the read-only root.
func TestCachedRootfsRunsUnderRunsc(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	res := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())

	const code = `
import os, errno
open("/tmp/x", "w").write("ok")
try:
    open("/var/tmp/flmbox-write-test", "w")
    root = "writable"
except OSError as e:
    root = errno.errorcode[e.errno]
print("agent-perf-ok", os.getuid(), os.getgid(), open("/tmp/x").read(), root)
`
	spec, err := runtime.GenerateSpec(
		runtime.WithRootfs(res.Rootfs),
		runtime.WithTmp(64<<20),
		runtime.WithEnv([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}),
		runtime.WithArgs("python3", "-c", code),
	)
	if err != nil {
		t.Fatal(err)
	}
	bundle := t.TempDir()
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	// runsc --network=none keeps a network namespace mounted in its root
	// directory; unmount it before the directory is removed.
	t.Cleanup(func() { unix.Unmount(filepath.Join(state, "null-netns"), unix.MNT_DETACH) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := "flmbox-it-" + strings.ToLower(t.Name()[:8])
	cmd := exec.CommandContext(ctx, runscPath, "--root", state, "--network=none", "run", "--bundle", bundle, id)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	defer exec.Command(runscPath, "--root", state, "--network=none", "delete", "--force", id).Run()
	if err != nil {
		t.Fatalf("runsc run: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != "agent-perf-ok 65534 65534 ok EROFS" {
		t.Fatalf("python3 under runsc printed %q (stderr %s)", got, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(res.Rootfs, "var", "tmp", "flmbox-write-test")); !os.IsNotExist(err) {
		t.Fatalf("the sandbox wrote the shared rootfs: %v", err)
	}
}
