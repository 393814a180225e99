package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

func TestEnvironment(t *testing.T) {
	image := []string{"PATH=/usr/bin:/bin", "LANG=C", "PYTHONPATH=/image"}
	for _, tc := range []struct {
		name         string
		image, extra []string
		pythonpath   string
	}{
		{"none", []string{"PATH=/bin"}, nil, "/tmp/site-packages"},
		{"the image's", image, nil, "/tmp/site-packages:/image"},
		{"the caller's replaces the image's", image, []string{"PYTHONPATH=/x"}, "/tmp/site-packages:/x"},
		{"the caller's last one", image, []string{"PYTHONPATH=/x", "PYTHONPATH=/y:/z"}, "/tmp/site-packages:/y:/z"},
		{"the caller's empty one", image, []string{"PYTHONPATH="}, "/tmp/site-packages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := Environment(tc.image, tc.extra)
			var got []string
			for _, kv := range env {
				if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
					got = append(got, v)
				}
			}
			if !slices.Equal(got, []string{tc.pythonpath}) {
				t.Fatalf("PYTHONPATH settings %q, want exactly %q; environment %q", got, tc.pythonpath, env)
			}
		})
	}
	env := Environment(image, []string{"LANG=en_US.UTF-8", "HOME=/root"})
	last := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		last[k] = v
	}
	if last["LANG"] != "en_US.UTF-8" || last["HOME"] != "/root" || last["PIP_BREAK_SYSTEM_PACKAGES"] != "1" || last["PIP_TARGET"] != "" || last["PATH"] != "/usr/bin:/bin" {
		t.Fatalf("later settings must win over earlier ones: %q", env)
	}
	// An image that sets no PATH gets docker's; the caller's still wins.
	for _, tc := range []struct {
		image, extra []string
		want         string
	}{
		{nil, nil, DefaultPath},
		{[]string{"LANG=C"}, []string{"PATH=/opt/bin"}, "/opt/bin"},
		{[]string{"PATH=/image/bin"}, nil, "/image/bin"},
	} {
		var paths []string
		for _, kv := range Environment(tc.image, tc.extra) {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				paths = append(paths, v)
			}
		}
		if len(paths) == 0 || paths[len(paths)-1] != tc.want {
			t.Errorf("image %q, extra %q: PATH settings %q, want the last %q", tc.image, tc.extra, paths, tc.want)
		}
	}
}

func TestSpecDefaults(t *testing.T) {
	s, err := Spec{Image: "img"}.withDefaults("")
	if err != nil {
		t.Fatal(err)
	}
	if s.Network != "none" || s.Limits != DefaultLimits || s.TmpBytes != DefaultTmpBytes {
		t.Fatalf("defaults: %+v", s)
	}
	if _, err := (Spec{Image: "img", Network: NetworkEgress}).withDefaults(""); err != nil {
		t.Fatalf("egress that allows nothing: %v", err)
	}
	for _, bad := range []Spec{
		{},
		{Image: "img", Network: "bridge"},
		{Image: "img", Network: "sandbox"}, // runsc's name, not a sandbox's network
		{Image: "img", Egress: Egress{Allow: []EgressRule{{Name: "pypi.org"}}}},
		{Image: "img", Network: NetworkHost, Egress: Egress{Deny: []EgressRule{{Name: "pypi.org"}}}},
		{Image: "img", Network: NetworkEgress, Egress: Egress{DNS: []netip.Addr{netip.MustParseAddr("::1")}}},
		{Image: "img", Platform: "xen"},
		{Image: "img", Env: []string{"NOEQUALS"}},
		{Image: "img", Env: []string{"=v"}},
		{Image: "img", Pip: []string{"--index-url=http://evil"}},
		{Image: "img", Pip: []string{"a\nb"}},
		{Image: "img", TmpBytes: -1},
		{Image: "img", TmpBytes: MinTmpBytes - 1},
		{Image: "img", Limits: Limits{MemoryBytes: MinMemoryBytes - 1}},
		{Image: "img", Limits: Limits{Pids: MinPids - 1}},
		{Image: "img", Limits: Limits{Pids: -1}},
		{Image: "img", Limits: Limits{CPUs: MinCPUs / 2}},
		{Image: "img", Limits: Limits{CPUs: math.NaN()}},
	} {
		if _, err := bad.withDefaults(""); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v, want an invalid argument", bad, err)
		}
	}
}

// A refusal names each limit below its minimum, and the minimum.
func TestSpecMinimumLimits(t *testing.T) {
	min := Spec{Image: "img", Limits: Limits{MemoryBytes: MinMemoryBytes, CPUs: MinCPUs, Pids: MinPids}, TmpBytes: MinTmpBytes}
	if _, err := min.withDefaults(""); err != nil {
		t.Fatalf("the minimum limits: %v", err)
	}
	_, err := Spec{Image: "img", Limits: Limits{Pids: 4}, TmpBytes: 16}.withDefaults("")
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("pids 4: %v", err)
	}
	for _, want := range []string{"pids 4 is below the minimum of 64", "/tmp size 16 bytes is below the minimum of 1048576"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q: want %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "memory") || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q: want one line, naming only the limits too small", err)
	}
}

func TestRequest(t *testing.T) {
	w, err := Request{Code: "print(1)"}.wire()
	if err != nil || w.Language != Python || w.TimeoutMS != DefaultTimeout.Milliseconds() || w.Version != wire.ProtocolVersion {
		t.Fatalf("defaults: %+v %v", w, err)
	}
	for _, bad := range []Request{
		{Language: "ruby"},
		{Timeout: time.Microsecond},
		{Timeout: -time.Second},
		{Code: "a\x00b"},
		{MaxOutput: -1},
		{Env: []string{"NOVALUE"}},
		{Interpreter: "bin/bash"},
		{File: "a/main.py"},
		{CopyIn: []CopyIn{{Dst: "tmp/x"}}},
	} {
		if err := bad.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v, want an invalid argument", bad, err)
		}
	}
	env := []string{"A=1", "PYTHONPATH=/x", "B=2", "PYTHONPATH="}
	w, err = Request{Env: env, Stdin: []byte("in"), Interpreter: "bash", Language: Shell}.wire()
	if err != nil || string(w.Stdin) != "in" || w.Interpreter != "bash" ||
		!slices.Equal(w.Env, []string{"A=1", "PYTHONPATH=/tmp/site-packages:/x", "B=2", "PYTHONPATH=/tmp/site-packages"}) {
		t.Fatalf("stdin, env, interpreter: %+v %v", w, err)
	}
	if env[1] != "PYTHONPATH=/x" {
		t.Fatalf("the caller's env changed: %q", env)
	}
}

// writeRecord makes a sandbox directory under root as Create leaves it.
func writeRecord(t *testing.T, root string, rec record.Record) string {
	t.Helper()
	dir := stateroot.Sandbox(root, rec.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec.Dir = dir
	if err := record.Write(&rec); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReconcile: what a killed Create or Remove left is removed, unless
// its directory's lock is held (another process is at work on it); a
// running sandbox is left alone.
func TestReconcile(t *testing.T) {
	root := t.TempDir()
	m, err := Open(root, WithRunsc("/no/such/runsc"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := stateroot.Sandbox(root, ".new-123") // a killed Create's, an hour ago
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	hourAgo := time.Now().Add(-time.Hour)
	if err := os.Chtimes(tmp, hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	fresh := stateroot.Sandbox(root, ".new-456") // a Create's, about to lock it
	if err := os.MkdirAll(fresh, 0o700); err != nil {
		t.Fatal(err)
	}
	damaged := writeRecord(t, root, record.Record{Name: "damaged", State: record.Creating})
	if err := os.WriteFile(filepath.Join(damaged, "sandbox.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	killed := writeRecord(t, root, record.Record{Name: "killed", State: record.Creating})
	removing := writeRecord(t, root, record.Record{Name: "removing", State: record.Removing})
	norecord := stateroot.Sandbox(root, "norecord")
	os.MkdirAll(norecord, 0o700)
	running := writeRecord(t, root, record.Record{Name: "running", State: record.Running})
	busy := writeRecord(t, root, record.Record{Name: "busy", State: record.Creating})
	l, err := tryLock(busy)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if err := m.Reconcile(context.Background()); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("Reconcile: %v, want the damaged record reported", err)
	}
	for _, gone := range []string{tmp, killed, removing, norecord} {
		if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: %v", gone, err)
		}
	}
	for _, kept := range []string{running, busy, fresh, damaged} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s was removed: %v", kept, err)
		}
	}
	sbs, err := m.List(context.Background())
	if err != nil || len(sbs) != 2 {
		t.Fatalf("List: %v, %v", sbs, err)
	}
	for _, sb := range sbs {
		if want := map[string]State{"running": StateRunning, "busy": StateCreating}[sb.Name]; sb.State != want {
			t.Errorf("listed: %s is %s, want %s as recorded", sb.Name, sb.State, want)
		}
	}
	sbs = m.Probe(context.Background(), sbs...)
	for _, sb := range sbs {
		want := map[string]State{"running": StateDead, "busy": StateCreating}[sb.Name] // no agent answers
		if sb.State != want {
			t.Errorf("%s is %s, want %s", sb.Name, sb.State, want)
		}
	}
}

// TestReconcileOwner: a running sandbox whose owner is gone is removed,
// saying so, by Reconcile and by Get; one whose owner lives, and one
// without an owner, are left.
func TestReconcileOwner(t *testing.T) {
	root := t.TempDir()
	var warnings []string
	m, err := Open(root, WithRunsc("/no/such/runsc"), WithWarnf(func(f string, a ...any) {
		warnings = append(warnings, fmt.Sprintf(f, a...))
	}))
	if err != nil {
		t.Fatal(err)
	}
	me, err := record.Self()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("true")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	// Reaped: its pid is free, or another process's, which started later.
	gone := &record.Owner{PID: child.Process.Pid, Start: me.Start, PIDNS: me.PIDNS}
	orphan := writeRecord(t, root, record.Record{Name: "orphan", State: record.Running, Owner: gone})
	owned := writeRecord(t, root, record.Record{Name: "owned", State: record.Running, Owner: me})
	kept := writeRecord(t, root, record.Record{Name: "kept", State: record.Running})
	if err := m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox of a gone owner is left: %v", err)
	}
	for _, dir := range []string{owned, kept} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s was removed: %v", dir, err)
		}
	}
	want := fmt.Sprintf("removing sandbox orphan, whose owner flmbox process %d is gone", gone.PID)
	if !slices.Equal(warnings, []string{want}) {
		t.Errorf("warnings %q, want %q", warnings, want)
	}
	sbs, err := m.List(context.Background())
	if err != nil || len(sbs) != 2 {
		t.Fatalf("List: %v, %v", sbs, err)
	}
	for _, sb := range sbs {
		if want := map[string]int{"owned": me.PID}[sb.Name]; sb.OwnerPID != want {
			t.Errorf("%s: owner pid %d, want %d", sb.Name, sb.OwnerPID, want)
		}
	}

	// Get and List only read: what they find is Reconcile's to remove.
	writeRecord(t, root, record.Record{Name: "orphan", State: record.Running, Owner: gone})
	if sb, err := m.Get(context.Background(), "orphan"); err != nil || sb.OwnerPID != gone.PID {
		t.Errorf("Get of a sandbox whose owner is gone: %v, %v", sb, err)
	}
	if sbs, err := m.List(context.Background()); err != nil || len(sbs) != 3 {
		t.Errorf("List with a sandbox whose owner is gone: %d sandboxes, %v", len(sbs), err)
	}
	if _, err := os.Stat(orphan); err != nil {
		t.Errorf("Get or List removed the sandbox of a gone owner: %v", err)
	}
}

// TestBatchResults: a batch says of each snippet whether it ran; one that
// ran and failed to reach its sandbox has the error, the others still run.
func TestBatchResults(t *testing.T) {
	m, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reqs := []Request{{Code: "x = 1"}, {Code: "import os"}, {Language: Shell, Code: "true"}}
	res, err := m.Batch(context.Background(), Target{Sandbox: "nosuch"}, reqs, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Ran || !errdefs.IsNotFound(r.Err) || r.Result != nil {
			t.Errorf("snippet %d: %+v", i, r)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err = m.Batch(ctx, Target{Sandbox: "nosuch"}, reqs, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Ran && !errdefs.IsNotFound(r.Err) {
			t.Errorf("cancelled batch, snippet %d: %+v", i, r)
		}
	}
	for _, tc := range []struct {
		name   string
		target Target
		reqs   []Request
	}{
		{"no target", Target{}, reqs},
		{"two targets", Target{Sandbox: "a", Spec: &Spec{Image: "i"}}, reqs},
		{"empty", Target{Sandbox: "a"}, nil},
		{"too many", Target{Sandbox: "a"}, make([]Request, MaxBatch+1)},
		{"pip", Target{Spec: &Spec{Image: "i", Pip: []string{"six"}}}, reqs},
		{"a bad snippet", Target{Sandbox: "a"}, []Request{{Code: "1"}, {Language: "ruby"}}},
		{"reset", Target{Sandbox: "a"}, []Request{{Reset: true}}},
		{"a named spec", Target{Spec: &Spec{Image: "i", Name: "one"}}, reqs},
		{"a bad spec", Target{Spec: &Spec{Image: "i", Env: []string{"NOEQUALS"}}}, reqs},
	} {
		if _, err := m.Batch(context.Background(), tc.target, tc.reqs, 0); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want an invalid argument", tc.name, err)
		}
	}
}

func TestCallRefuses(t *testing.T) {
	root := t.TempDir()
	m, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	writeRecord(t, root, record.Record{Name: "creating", State: record.Creating})
	for _, tc := range []struct {
		name string
		is   func(error) bool
	}{
		{"nosuch", errdefs.IsNotFound},
		{"../x", errdefs.IsInvalidArgument},
		{"creating", errdefs.IsFailedPrecondition},
	} {
		if _, err := m.Call(context.Background(), tc.name, Request{Code: "1"}); !tc.is(err) {
			t.Errorf("call %s: %v", tc.name, err)
		}
	}
}

func TestAgent(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, AgentName)
	testprog.Write(t, exe, []byte("#!/bin/sh\n"))
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, nil, 0o644)
	for _, tc := range []struct {
		path string
		ok   bool
	}{{exe, true}, {plain, false}, {dir, false}, {filepath.Join(dir, "missing"), false}} {
		m, _ := Open(dir, WithAgent(tc.path))
		p, err := m.Agent()
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrNoAgent)) || (tc.ok && p != tc.path) {
			t.Errorf("agent %s: %q, %v", tc.path, p, err)
		}
	}
}

// TestOpenMakesTheRootAbsolute: a relative root is taken against the
// working directory at Open (runsc is handed paths under it).
func TestOpenMakesTheRootAbsolute(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open("relative/dir")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cwd, "relative/dir"); m.Root() != want {
		t.Fatalf("Root() = %q, want %q", m.Root(), want)
	}
}

// TestLabels: Normalize takes labels within bounds and refuses the rest;
// HasLabels selects by key, or key and value.
func TestLabels(t *testing.T) {
	ok := map[string]string{"team": "ml", "app.example.com/run-id": "42", "empty": ""}
	if _, err := (Spec{Labels: ok}).Normalize(); err != nil {
		t.Fatalf("labels %v: %v", ok, err)
	}
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	for _, bad := range []map[string]string{
		{"": "v"}, {"a b": "v"}, {"k=v": "v"}, {strings.Repeat("k", 129): "v"},
		{"k": strings.Repeat("v", 1025)}, {"k": "line\nbreak"}, {"k": "\xff"}, many,
	} {
		if _, err := (Spec{Labels: bad}).Normalize(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("labels %.60v: %v, want invalid", bad, err)
		}
	}
	sb := &Sandbox{Labels: map[string]string{"team": "ml", "run": "42"}}
	for sel, want := range map[string]bool{"team=ml": true, "team=": true, "team=ml,run=42": true, "team=web": false, "owner=": false} {
		m := map[string]string{}
		for _, kv := range strings.Split(sel, ",") {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		if got := sb.HasLabels(m); got != want {
			t.Errorf("HasLabels(%s) = %v", sel, got)
		}
	}
}
