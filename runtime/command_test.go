package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// fakeRunsc is a runsc that hangs (sleeps) on one runsc command, and
// succeeds at once on every other, printing out on stdout; each run appends
// its pid, which leads its process group, to pids.
type fakeRunsc struct {
	path, pids string
}

func newFakeRunsc(t *testing.T, hang, out string) *fakeRunsc {
	t.Helper()
	dir := t.TempDir()
	f := &fakeRunsc{path: filepath.Join(dir, "runsc"), pids: filepath.Join(dir, "pids")}
	script := fmt.Sprintf(`#!/bin/sh
echo $$ >> %s
case " $* " in
*" %s "*) sleep 1000 ;;
esac
printf '%%s' '%s'
`, f.pids, hang, out)
	testprog.Write(t, f.path, []byte(script))
	return f
}

// left fails the test if a process of any group the fake runsc led is
// still there (its sleep included), once each has had a moment to die.
func (f *fakeRunsc) left(t *testing.T) {
	t.Helper()
	b, _ := os.ReadFile(f.pids)
	var groups []int
	for _, l := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(l)
		groups = append(groups, pid)
	}
	if len(groups) == 0 {
		t.Fatal("the fake runsc never ran")
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := groupMembers(t, groups)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left of the fake runsc's groups: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// groupMembers returns the processes, zombies aside, whose process group
// is one of groups.
func groupMembers(t *testing.T, groups []int) []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // state, ppid, pgrp...
		pgrp, _ := strconv.Atoi(f[2])
		for _, g := range groups {
			if pgrp == g && f[0] != "Z" {
				out = append(out, e.Name()+" "+s[:strings.LastIndexByte(s, ')')+1])
			}
		}
	}
	return out
}

// fastBounds are short bounds for every runsc command, for tests.
func fastBounds(d time.Duration) map[string]time.Duration {
	b := map[string]time.Duration{}
	for sub := range defaultBounds {
		b[sub] = d
	}
	return b
}

func TestHangingRunscIsKilledWithinItsBound(t *testing.T) {
	const bound = 300 * time.Millisecond
	c := Container{ID: "flmbox-0123", Network: NetworkNone}
	for _, tc := range []struct {
		hang string
		call func(ctx context.Context, r *Runtime) error
		// ok: the call gets over the hang (Delete kills a sandbox that
		// does not answer runsc kill itself).
		ok bool
	}{
		{"kill", func(ctx context.Context, r *Runtime) error { return r.Delete(ctx, c) }, true},
		{"kill", func(ctx context.Context, r *Runtime) error { return r.Signal(ctx, c, 15) }, false},
		{"delete", func(ctx context.Context, r *Runtime) error { return r.Delete(ctx, c) }, false},
		{"state", func(ctx context.Context, r *Runtime) error { _, err := r.Running(ctx, c); return err }, false},
		{"list", func(ctx context.Context, r *Runtime) error {
			// A state file named otherwise than this runsc names them
			// makes List ask runsc.
			os.WriteFile(filepath.Join(r.root, "older-runsc.state"), nil, 0o600)
			_, err := r.List(ctx)
			return err
		}, false},
		{"checkpoint", func(ctx context.Context, r *Runtime) error { return r.Checkpoint(ctx, c, t.TempDir(), true) }, false},
	} {
		t.Run(tc.hang, func(t *testing.T) {
			f := newFakeRunsc(t, tc.hang, "[]")
			r, err := NewRuntime(f.path, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			r.bounds = fastBounds(bound)
			start := time.Now()
			err = tc.call(context.Background(), r)
			if took := time.Since(start); took > bound+2*time.Second {
				t.Errorf("returned after %s, bound %s", took, bound)
			}
			f.left(t)
			if tc.ok {
				if err != nil {
					t.Fatalf("got %v", err)
				}
				return
			}
			var te *TimeoutError
			if !errors.As(err, &te) || te.Command != tc.hang || !errors.Is(err, context.DeadlineExceeded) || !errdefs.IsUnavailable(err) {
				t.Fatalf("got %v, want a timeout of runsc %s that is Unavailable and DeadlineExceeded", err, tc.hang)
			}
			if want := "runsc " + tc.hang + " did not finish in 300ms"; !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q does not say %q on one line", err, want)
			}
		})
	}
}

func TestCancelKillsRunsc(t *testing.T) {
	c := Container{ID: "flmbox-0123", Network: NetworkNone}
	for _, tc := range []struct {
		hang string
		call func(ctx context.Context, r *Runtime) error
	}{
		{"kill", func(ctx context.Context, r *Runtime) error { return r.Delete(ctx, c) }},
		{"state", func(ctx context.Context, r *Runtime) error { _, err := r.Running(ctx, c); return err }},
		{"run", func(ctx context.Context, r *Runtime) error {
			bundle := t.TempDir()
			log, err := os.Create(filepath.Join(bundle, "log"))
			if err != nil {
				t.Fatal(err)
			}
			defer log.Close()
			_, err = r.Run(ctx, c, bundle, &specs.Spec{}, log)
			return err
		}},
	} {
		t.Run(tc.hang, func(t *testing.T) {
			f := newFakeRunsc(t, tc.hang, "")
			r, err := NewRuntime(f.path, t.TempDir()) // default bounds: far longer than the test waits
			if err != nil {
				t.Fatal(err)
			}
			cause := errors.New("SIGTERM received")
			ctx, cancel := context.WithCancelCause(context.Background())
			time.AfterFunc(300*time.Millisecond, func() { cancel(cause) })
			start := time.Now()
			err = tc.call(ctx, r)
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("returned %s after the start, the cancel came at 300ms", took)
			}
			if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
				t.Errorf("got %v, want context.Canceled and its cause", err)
			}
			f.left(t)
		})
	}
}

func TestRunscFailureSaysWhy(t *testing.T) {
	dir := t.TempDir()
	runsc := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\necho 'W1203 a warning' >&2\necho 'loading container: container does not exist' >&2\nexit 1\n"
	testprog.Write(t, runsc, []byte(script))
	r, err := NewRuntime(runsc, filepath.Join(dir, "root"))
	if err != nil {
		t.Fatal(err)
	}
	c := Container{ID: "flmbox-0123", Network: NetworkNone}
	if ok, err := r.Running(context.Background(), c); ok || err != nil {
		t.Errorf("Running of a container runsc does not know: %v, %v; want false, nil", ok, err)
	}
	err = r.Signal(context.Background(), c, 15)
	if want := "runsc kill: exit status 1: loading container: container does not exist"; err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("Signal: %v, want it to end with %q", err, want)
	}
	if err := r.Delete(context.Background(), c); err != nil {
		t.Errorf("Delete of a container runsc does not know: %v", err)
	}
}

func TestListReadsStateFileNames(t *testing.T) {
	f := newFakeRunsc(t, "", `[{"id":"from-runsc"}]`)
	r, err := NewRuntime(f.path, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"flmbox-a_sandbox:flmbox-a.state", "flmbox-a_sandbox:flmbox-a.lock", "flmbox-b_sandbox:flmbox-b.state", "runsc.sock"} {
		if err := os.WriteFile(filepath.Join(r.root, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := r.List(context.Background())
	if err != nil || !slices.Equal(ids, []string{"flmbox-a", "flmbox-b"}) {
		t.Fatalf("List = %q, %v; want the state files' IDs", ids, err)
	}
	if _, err := os.Stat(f.pids); err == nil {
		t.Error("List ran runsc")
	}
	// A state file this runsc would not write: runsc list says.
	if err := os.WriteFile(filepath.Join(r.root, "other.state"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ids, err := r.List(context.Background()); err != nil || !slices.Equal(ids, []string{"from-runsc"}) {
		t.Fatalf("List = %q, %v; want runsc list's", ids, err)
	}
}
