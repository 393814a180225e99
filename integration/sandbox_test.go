//go:build integration

package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/snippet/wire"
)

// newRuntime returns a Runtime whose runsc state is under a temporary
// directory, unmounting what runsc mounts there when the test ends.
func newRuntime(t *testing.T) *runtime.Runtime {
	t.Helper()
	dir := t.TempDir()
	rt, err := runtime.NewRuntime(runscPath, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(dir, "null-netns"), unix.MNT_DETACH) })
	return rt
}

// newManager opens a Manager on a temporary state root with the tests'
// runsc and agent. When the test ends it removes every sandbox left there
// and unmounts runsc's null-netns.
func newManager(t *testing.T) (*sandbox.Manager, string) {
	t.Helper()
	return newManagerIn(t, t.TempDir())
}

// newPrewarmedManager is newManager in a copy of the root the test image
// was prewarmed into (copyPrewarmed): a Create or a Prewarm of the image
// from the shared registry unpacks nothing.
func newPrewarmedManager(t *testing.T) (*sandbox.Manager, string) {
	t.Helper()
	root := t.TempDir()
	copyPrewarmed(t, root)
	return newManagerIn(t, root)
}

// newManagerIn is newManager in the state root root.
func newManagerIn(t *testing.T, root string) (*sandbox.Manager, string) {
	t.Helper()
	m, err := sandbox.Open(root, sandbox.WithRunsc(runscPath), sandbox.WithAgent(flmboxAgent),
		sandbox.WithWarnf(func(f string, a ...any) { t.Logf("warning: "+f, a...) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sbs, _ := m.List(ctx)
		for _, sb := range sbs {
			if err := m.Remove(ctx, sb.Name); err != nil {
				t.Errorf("clean up: %v", err)
			}
		}
		unix.Unmount(filepath.Join(stateroot.Runsc(root), "null-netns"), unix.MNT_DETACH)
	})
	return m, root
}

// runscProcesses counts host processes whose command line names id.
func runscProcesses(t *testing.T, id string) int {
	t.Helper()
	out, _ := exec.Command("pgrep", "-f", id).Output()
	return len(strings.Fields(string(out)))
}

// waitNoProcesses waits until no host process names id.
func waitNoProcesses(t *testing.T, id string) {
	t.Helper()
	pollUntil(t, 20*time.Second, "no host process names "+id, func() bool { return runscProcesses(t, id) == 0 })
}

// TestRuntimeRunAliveDelete drives runsc through package runtime alone: a
// container runs, is alive and has host processes; Delete leaves neither
// and is idempotent; a container whose first process does not exist fails
// to run and leaves nothing behind.
func TestRuntimeRunAliveDelete(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	res := prewarmJSON(t, sandboxRoot(t, reg), "--platform", "linux/amd64", reg.digestRef())
	rt := newRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// run runs a container whose first process is args, in a bundle of its
	// own; the container is deleted when the test ends.
	run := func(args ...string) (runtime.Container, error) {
		t.Helper()
		spec, err := runtime.GenerateSpec(runtime.WithRootfs(res.Rootfs), runtime.WithTmp(16<<20),
			runtime.WithArgs(args...), runtime.WithEnv([]string{"PATH=/usr/bin:/bin"}))
		if err != nil {
			t.Fatal(err)
		}
		bundle := t.TempDir()
		log, err := os.Create(filepath.Join(t.TempDir(), "console.log"))
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		c := runtime.Container{ID: runtime.NewID(), Network: runtime.NetworkNone}
		t.Cleanup(func() { rt.Delete(context.Background(), c) })
		_, err = rt.Run(ctx, c, bundle, spec, log)
		return c, err
	}
	// known reports whether runsc still has state of c.
	known := func(c runtime.Container) bool {
		return exec.CommandContext(ctx, rt.Runsc(), rt.Args(c, "state", c.ID)...).Run() == nil
	}

	c, err := run("sleep", "infinity")
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !rt.Alive(ctx, c) {
		t.Fatal("a running container is not alive")
	}
	if !known(c) {
		t.Fatal("runsc state does not know the running container")
	}
	if n := runscProcesses(t, c.ID); n == 0 {
		t.Fatal("no host process names the container's ID")
	}
	if err := rt.Delete(ctx, c); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if rt.Alive(ctx, c) {
		t.Fatal("a deleted container is alive")
	}
	if known(c) {
		t.Fatal("runsc still has state of a deleted container")
	}
	waitNoProcesses(t, c.ID)
	if err := rt.Delete(ctx, c); err != nil {
		t.Fatalf("delete is not idempotent: %v", err)
	}

	// A first process that does not exist: Run fails, nothing is left.
	c, err = run("/no/such/binary")
	if err == nil {
		t.Fatal("run with a missing first process succeeded")
	}
	t.Logf("run with a missing first process: %v", err)
	if rt.Alive(ctx, c) {
		t.Fatal("a failed run left a live container")
	}
	if known(c) {
		t.Fatal("a failed run left runsc state")
	}
	waitNoProcesses(t, c.ID)
}

// TestManagerLifecycle drives a sandbox through package sandbox in this
// process, as a Go program embedding flmbox would: create, refused
// duplicates and bad names, calls sharing /tmp, death behind flmbox's back,
// removal (idempotent) that leaves no directory, process or image lease.
func TestManagerLifecycle(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	linkPrewarmed(t, root) // it removes the image
	m, _ := newManagerIn(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	image := reg.digestRef()

	sb, err := m.Create(ctx, sandbox.Spec{Name: "life", Image: image})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.Name != "life" || sb.State != sandbox.StateRunning || sb.ID == "" || sb.Manifest == "" {
		t.Fatalf("create returned %+v", sb)
	}
	if n := runscProcesses(t, sb.ID); n == 0 {
		t.Fatal("no host process names the sandbox's ID")
	}
	store, err := m.Images()
	if err != nil {
		t.Fatal(err)
	}
	holders := func() []string {
		t.Helper()
		leases, err := store.Leases()
		if err != nil {
			t.Fatal(err)
		}
		var hs []string
		for _, l := range leases {
			hs = append(hs, l.ManifestDigest+" "+l.Holder)
		}
		return hs
	}
	lease := sb.Manifest + " life." + sb.ID // the holder names the sandbox and its container
	if hs := holders(); len(hs) != 1 || hs[0] != lease {
		t.Fatalf("leases after create: %q", hs)
	}

	if _, err := m.Create(ctx, sandbox.Spec{Name: "life", Image: image}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a second sandbox with the same name: %v", err)
	}
	for _, bad := range []string{"../x", "a/b", ".hidden", strings.Repeat("n", 65)} {
		if _, err := m.Create(ctx, sandbox.Spec{Name: bad, Image: image}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	// The refused creates left the first sandbox, its lease, and nothing else.
	if got, err := m.Get(ctx, "life"); err != nil || got.State != sandbox.StateRunning || got.ID != sb.ID {
		t.Fatalf("after refused creates, get: %+v, %v", got, err)
	}
	if hs := holders(); len(hs) != 1 || hs[0] != lease {
		t.Fatalf("leases after refused creates: %q", hs)
	}
	ents, _ := os.ReadDir(stateroot.Sandboxes(root))
	if len(ents) != 1 || ents[0].Name() != "life" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("sandbox directories after refused creates: %q", names)
	}
	if _, err := os.Stat(filepath.Join(root, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a create named ../x made %s: %v", filepath.Join(root, "x"), err)
	}

	// Calls run code; files under /tmp persist between them.
	call := func(lang, code string) *sandbox.Result {
		t.Helper()
		res, err := m.Call(ctx, "life", sandbox.Request{Language: lang, Code: code})
		if err != nil {
			t.Fatalf("call %q: %v", code, err)
		}
		return res
	}
	if res := call(wire.LanguageShell, "mkdir -p /tmp/keep && echo kept > /tmp/keep/f && echo wrote"); res.ExitCode != 0 || string(res.Stdout.Data) != "wrote\n" {
		t.Fatalf("shell call: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout.Data, res.Stderr.Data)
	}
	if res := call(wire.LanguagePython, "print(open('/tmp/keep/f').read().strip())"); res.ExitCode != 0 || string(res.Stdout.Data) != "kept\n" {
		t.Fatalf("python call: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout.Data, res.Stderr.Data)
	}

	// Kill the sandbox's gVisor processes behind flmbox's back: dead.
	exec.Command("pkill", "-9", "-f", sb.ID).Run()
	var state sandbox.State
	pollUntil(t, 20*time.Second, "the killed sandbox is dead", func() bool {
		got, err := m.Get(ctx, "life")
		if err != nil {
			t.Fatalf("get a killed sandbox: %v", err)
		}
		got = m.Probe(ctx, got)[0]
		state = got.State
		return state == sandbox.StateDead
	})
	if _, err := m.Call(ctx, "life", sandbox.Request{Code: "print(1)"}); !errors.Is(err, sandbox.ErrDead) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("call a dead sandbox: %v", err)
	}

	if err := m.Remove(ctx, "life"); err != nil {
		t.Fatalf("remove a dead sandbox: %v", err)
	}
	if err := m.Remove(ctx, "life"); err != nil {
		t.Fatalf("remove is not idempotent: %v", err)
	}
	for _, dir := range []string{stateroot.Sandbox(root, "life"), sb.Bundle} {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("sandbox directory %s left: %v", dir, err)
		}
	}
	if _, err := m.Get(ctx, "life"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after remove: %v", err)
	}
	waitNoProcesses(t, sb.ID)
	if hs := holders(); len(hs) != 0 {
		t.Fatalf("leases after remove: %q", hs)
	}
	removed, err := store.Remove(ctx, image)
	if err != nil || len(removed) == 0 {
		t.Fatalf("remove the image after its sandbox: %v, %v", removed, err)
	}
}
