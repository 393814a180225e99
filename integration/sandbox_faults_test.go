//go:build integration

package integration

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox"
)

// faultsRootClean fails t unless the state root holds exactly the sandboxes
// named: no other directory under sandboxes/, no lease but theirs, no mount
// but their run directories and runsc's null-netns, no runsc container but
// theirs (a suspended sandbox has none).
func faultsRootClean(t *testing.T, m *sandbox.Manager, root string, names ...string) {
	t.Helper()
	ents, _ := os.ReadDir(stateroot.Sandboxes(root))
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(names))
	if !slices.Equal(got, want) {
		t.Errorf("sandboxes/ holds %q, want %q", got, want)
	}
	store, err := m.Images()
	if err != nil {
		t.Fatal(err)
	}
	leases, err := store.Leases()
	if err != nil || len(leases) != len(names) {
		t.Errorf("image leases %+v (%v), want %d", leases, err, len(names))
	}
	for _, mt := range flmboxMounts(t, root) {
		if filepath.Base(mt) == "null-netns" || slices.Contains(names, filepath.Base(filepath.Dir(mt))) {
			continue
		}
		t.Errorf("mount left: %s", mt)
	}
	rt, err := runtime.NewRuntime(runscPath, stateroot.Runsc(root))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var known []string
	for _, name := range names {
		if sb, err := m.Get(context.Background(), name); err == nil {
			known = append(known, sb.ID)
		}
	}
	for _, id := range ids {
		if !slices.Contains(known, id) {
			t.Errorf("runsc container %s left, which no sandbox of %q is", id, names)
		}
	}
}

// TestSandboxFaultsLeaveNothing walks the failures of Create (a ctx that
// ends), CopyIn and CopyOut (a missing path), Suspend (a sandbox not
// running) and Resume (runsc gone, a damaged image) with the real runsc,
// and checks the state root after each: nothing left but what was there,
// a failed resume recorded suspended at once, errors of one line that keep
// their kind and ctx's end.
func TestSandboxFaultsLeaveNothing(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	m, root := newPrewarmedManager(t)
	ctx := context.Background()
	if _, err := m.Images(); err != nil {
		t.Fatal(err)
	}
	store, _ := m.Images()
	if _, err := store.Prewarm(ctx, reg.digestRef(), nil); err != nil {
		t.Fatal(err)
	}

	// Create under a ctx that ends while runsc makes the sandbox: a runsc
	// whose run waits 5 s first, on the same root, with a ctx of 1 s.
	slow := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = run ] && sleep 5; done\nexec " + runscPath + " \"$@\"\n"
	testprog.Write(t, slow, []byte(script))
	ms, err := sandbox.Open(root, sandbox.WithRunsc(slow), sandbox.WithAgent(flmboxAgent))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = ms.Create(cctx, sandbox.Spec{Name: "late", Image: reg.digestRef()})
	cancel()
	t.Logf("create under an ending ctx: %v", err)
	if !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "\n") {
		t.Errorf("create under an ending ctx: %q, want one line with context.DeadlineExceeded in its chain", err)
	}
	faultsRootClean(t, m, root)

	sb, err := m.Create(ctx, sandbox.Spec{Name: "f", Image: reg.digestRef()})
	if err != nil {
		t.Fatal(err)
	}
	// Copies of a missing path.
	rc, err := m.CopyOut(ctx, "f", "/tmp/no/such/file", sandbox.CopyOptions{})
	if err == nil {
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
	}
	t.Logf("copy out of a missing file: %v", err)
	if err == nil {
		t.Error("copy out of a missing file succeeded")
	}
	if err := m.CopyIn(ctx, "f", "/tmp/no/such/dir/", strings.NewReader("not a tar"), sandbox.CopyOptions{}); err == nil {
		t.Error("copy of garbage into a missing directory succeeded")
	}
	faultsRootClean(t, m, root, "f")

	if err := m.Suspend(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if err := m.Suspend(ctx, "nosuch"); !errdefs.IsNotFound(err) {
		t.Errorf("suspend of no sandbox: %v", err)
	}
	// Resume with runsc gone: suspended at once, the next call says so.
	gone, err := sandbox.Open(root, sandbox.WithRunsc(filepath.Join(t.TempDir(), "runsc")), sandbox.WithAgent(flmboxAgent))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gone.Resume(ctx, "f"); err == nil {
		t.Fatal("resume without runsc succeeded")
	}
	if got, err := m.Get(ctx, "f"); err != nil || got.State != sandbox.StateSuspended {
		t.Fatalf("after a resume without runsc: %+v, %v; want suspended", got, err)
	}
	if _, err := m.Call(ctx, "f", sandbox.Request{Code: "1"}); !errors.Is(err, sandbox.ErrSuspended) {
		t.Errorf("call after a resume without runsc: %v, want ErrSuspended", err)
	}

	// A damaged image: one line that says so, names the log, and the
	// sandbox stays suspended.
	img := filepath.Join(sb.Bundle, "checkpoint", "checkpoint.img")
	f, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}
	f.WriteAt(garbage, 0)
	f.Close()
	_, err = m.Resume(ctx, "f")
	t.Logf("resume of a damaged image: %v", err)
	if !errors.Is(err, sandbox.ErrCheckpointDamaged) || !errdefs.IsDataLoss(err) || strings.Contains(err.Error(), "\n") ||
		!strings.Contains(err.Error(), filepath.Join(sb.Bundle, "console.log")) {
		t.Errorf("resume of a damaged image: %q, want one line, ErrCheckpointDamaged, the log named", err)
	}
	if got, err := m.Get(ctx, "f"); err != nil || got.State != sandbox.StateSuspended {
		t.Errorf("after a failed resume: %+v, %v; want suspended", got, err)
	}
	faultsRootClean(t, m, root, "f")
	if err := m.Remove(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	faultsRootClean(t, m, root)
}

// TestSandboxFaultsNonRoot: `flmbox sandbox create` as a user without root
// says in its first line that flmbox needs root, and leaves its state root
// as it was.
func TestSandboxFaultsNonRoot(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	dir, err := os.MkdirTemp("", "flmbox-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	for _, b := range []string{flmboxBin, flmboxCore, flmboxAgent} {
		data, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		testprog.Write(t, filepath.Join(dir, filepath.Base(b)), data)
	}
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(root, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "flmbox"), "--root", root, "sandbox", "create", "--name", "nr", "--image", reg.digestRef())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.Stdout = io.Discard
	err = cmd.Run()
	first, _, _ := strings.Cut(stderr.String(), "\n")
	t.Logf("as uid 65534: %v; stderr %q", err, stderr.String())
	if err == nil || !strings.Contains(first, "flmbox needs root") {
		t.Errorf("sandbox create as uid 65534: %v, first line %q: want a failure saying flmbox needs root", err, first)
	}
	ents, _ := os.ReadDir(stateroot.Sandboxes(root))
	if len(ents) > 0 {
		t.Errorf("left in sandboxes/: %d entries", len(ents))
	}
	if ls, _ := filepath.Glob(filepath.Join(stateroot.Images(root), "leases", "*")); len(ls) > 0 {
		t.Errorf("leases left: %q", ls)
	}
}

// TestSandboxFaultsGetList: Get and List describe a running sandbox as
// running, and so does Probe, which asks its agent. That Get and List run
// nothing (no runsc, no ping) is TestGetAndListRunNothing's, with a runsc
// that hangs; what they cost is flmbox bench's ("records").
func TestSandboxFaultsGetList(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	m, _ := newPrewarmedManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, sandbox.Spec{Name: "gl", Image: reg.digestRef()}); err != nil {
		t.Fatal(err)
	}
	sb, err := m.Get(ctx, "gl")
	if err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("Get: %+v, %v", sb, err)
	}
	sbs, err := m.List(ctx)
	if err != nil || len(sbs) != 1 || sbs[0].State != sandbox.StateRunning {
		t.Fatalf("List: %v, %v", sbs, err)
	}
	sbs = m.Probe(ctx, sbs...)
	if sbs[0].State != sandbox.StateRunning {
		t.Errorf("probed: %s, want running", sbs[0].State)
	}
}
