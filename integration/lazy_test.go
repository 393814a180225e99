//go:build integration

package integration

import (
	"strings"
	"testing"
)

// TestLazySpares: a sandbox made with --lazy-spares holds no process but its
// agent until its first call, runs Python and shell calls as any other, and
// its pool shape is its own (a pool of the default shape is not used for it).
func TestLazySpares(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	mustFlmbox(t, root, "sandbox", "create", "--name", "lazy", "--lazy-spares", "--image", image)
	t.Cleanup(func() { flmbox(t, root, "sandbox", "rm", "lazy") })
	// The first call sees only the agent and itself (and what it starts).
	out := mustFlmbox(t, root, "run", "--sandbox", "lazy", "--language", "shell", "-c",
		`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done`)
	if strings.Contains(out, "python") {
		t.Errorf("a lazy sandbox's first call found a Python process:\n%s", out)
	}
	if got := mustFlmbox(t, root, "run", "--sandbox", "lazy", "-c", "print(6*7)"); strings.TrimSpace(got) != "42" {
		t.Errorf("python call: %q", got)
	}
	if got := mustFlmbox(t, root, "run", "--sandbox", "lazy", "-c", "print(6*8)"); strings.TrimSpace(got) != "48" {
		t.Errorf("second python call: %q", got)
	}
	// A pool of the default shape does not serve a lazy spec.
	mustFlmbox(t, root, "pool", "fill", image, "--size", "1")
	if got := mustFlmbox(t, root, "run", "--image", image, "--lazy-spares", "-c", "print('ok')"); strings.TrimSpace(got) != "ok" {
		t.Errorf("run --image --lazy-spares: %q", got)
	}
	if out := mustFlmbox(t, root, "pool", "ls", "--json"); strings.Count(out, `"shape"`) != 1 {
		t.Errorf("pool ls after a lazy run --image: want the default pool alone:\n%s", out)
	}
}

// TestLazyPoolParksTheAgentAlone: a sandbox of a --lazy-spares pool, used
// once and released, waits in the pool with its agent alone: the release's
// reset starts no spare (no shell waits in it when the next user adopts
// it, lists its processes from Python and finds neither sh nor a second
// Python).
func TestLazyPoolParksTheAgentAlone(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := poolRoot(t, reg)
	image := reg.digestRef()
	pooled := sandboxID(t, root, fillPool(t, root, image, 1, "--lazy-spares").Idle[0])
	if got := mustFlmbox(t, root, "run", "--image", image, "--lazy-spares", "-l", "shell", "-c", "echo used"); strings.TrimSpace(got) != "used" {
		t.Fatalf("first use: %q", got)
	}
	mustFlmbox(t, root, "sandbox", "create", "--name", "next", "--lazy-spares", "--image", image)
	t.Cleanup(func() { flmbox(t, root, "sandbox", "rm", "next") })
	if id := sandboxID(t, root, "next"); id != pooled {
		t.Fatalf("sandbox create took container %s, not the pooled %s", id, pooled)
	}
	out := mustFlmbox(t, root, "run", "--sandbox", "next", "-c",
		"import os\nfor p in os.listdir('/proc'):\n    if p.isdigit() and int(p) != os.getpid():\n        try: print(open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\\0', b' ').decode())\n        except OSError: pass")
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.Contains(l, "flmbox-agent") {
			t.Errorf("the adopted lazy sandbox holds more than its agent: %q\n%s", l, out)
		}
	}
}
