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

	"github.com/flmbox/flmbox/runtime"
)

// newRuntime returns a Runtime under a temporary directory, unmounting what
// runsc mounts there when the test ends.
func newRuntime(t *testing.T) *runtime.Runtime {
	t.Helper()
	dir := t.TempDir()
	rt, err := runtime.NewRuntime(runscPath, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(dir, "runsc", "null-netns"), unix.MNT_DETACH) })
	return rt
}

// runscProcesses counts host processes whose command line names id.
func runscProcesses(t *testing.T, id string) int {
	out, _ := exec.Command("pgrep", "-f", id).Output()
	return len(strings.Fields(string(out)))
}

func TestSandboxLifecycle(t *testing.T) {
	reg := startRegistry(t)
	res := prewarmJSON(t, t.TempDir(), "--platform", "linux/amd64", reg.digestRef())
	rt := newRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := runtime.Config{Name: "life", Image: reg.digestRef(), Spec: []runtime.SpecOpt{
		runtime.WithRootfs(res.Rootfs), runtime.WithTmp(16 << 20), runtime.WithArgs("sleep", "infinity"),
		runtime.WithEnv([]string{"PATH=/usr/bin:/bin"}),
	}}
	sb, err := rt.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st := rt.State(ctx, sb); st != runtime.StateRunning {
		t.Fatalf("new sandbox is %s", st)
	}
	if n := runscProcesses(t, sb.ID); n == 0 {
		t.Fatal("no runsc process names the sandbox's ID")
	}
	if _, err := rt.Create(ctx, cfg); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a second sandbox with the same name: %v", err)
	}
	if st := rt.State(ctx, sb); st != runtime.StateRunning {
		t.Fatalf("the failed duplicate create harmed the first sandbox: %s", st)
	}
	for _, bad := range []string{"../x", "a/b", "", ".hidden", strings.Repeat("n", 65)} {
		if _, err := rt.Create(ctx, runtime.Config{Name: bad, Spec: cfg.Spec}); !errors.Is(err, errdefs.ErrInvalidArgument) && bad != "" {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	list, _ := rt.List()
	var names []string
	for _, s := range list {
		names = append(names, s.Name)
		if s.Name != "life" {
			rt.Remove(ctx, s.Name) // the generated-name create above
		}
	}
	if !strings.Contains(strings.Join(names, " "), "life") {
		t.Fatalf("list: %v", names)
	}

	// Kill the sandbox's gVisor processes behind flmbox's back: dead.
	exec.Command("pkill", "-9", "-f", sb.ID).Run()
	deadline := time.Now().Add(10 * time.Second)
	for rt.State(ctx, sb) != runtime.StateDead && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if st := rt.State(ctx, sb); st != runtime.StateDead {
		t.Fatalf("after its processes were killed the sandbox is %s", st)
	}
	if err := rt.Remove(ctx, "life"); err != nil {
		t.Fatalf("remove a dead sandbox: %v", err)
	}
	if err := rt.Remove(ctx, "life"); err != nil {
		t.Fatalf("remove is not idempotent: %v", err)
	}
	if _, err := os.Stat(sb.Dir); !os.IsNotExist(err) {
		t.Fatalf("sandbox directory left: %v", err)
	}
	if n := runscProcesses(t, sb.ID); n != 0 {
		t.Fatalf("%d runsc processes left", n)
	}
}

func TestSandboxRemoveStopsEverything(t *testing.T) {
	reg := startRegistry(t)
	res := prewarmJSON(t, t.TempDir(), "--platform", "linux/amd64", reg.digestRef())
	rt := newRuntime(t)
	ctx := context.Background()
	sb, err := rt.Create(ctx, runtime.Config{Name: "rm-me", Spec: []runtime.SpecOpt{
		runtime.WithRootfs(res.Rootfs), runtime.WithTmp(16 << 20), runtime.WithArgs("sleep", "infinity"),
		runtime.WithEnv([]string{"PATH=/usr/bin:/bin"}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Remove(ctx, "rm-me"); err != nil {
		t.Fatal(err)
	}
	if n := runscProcesses(t, sb.ID); n != 0 {
		t.Fatalf("%d runsc processes left after remove", n)
	}
	if _, err := rt.Get("rm-me"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after remove: %v", err)
	}
	// A failed create leaves nothing: a first process that does not exist.
	_, err = rt.Create(ctx, runtime.Config{Name: "broken", Spec: []runtime.SpecOpt{
		runtime.WithRootfs(res.Rootfs), runtime.WithTmp(16 << 20), runtime.WithArgs("/no/such/binary"),
	}})
	if err == nil {
		rt.Remove(ctx, "broken")
		t.Fatal("create with a missing first process succeeded")
	}
	if _, err := rt.Get("broken"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a failed create left a sandbox: %v", err)
	}
}
