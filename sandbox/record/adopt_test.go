package record

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/flock"
	"github.com/flmbox/flmbox/snippet/wire"
)

// parkIdle writes the record of an idle sandbox name of shape "s", parked
// at parked; with an agent that answers pings if answering.
func parkIdle(t *testing.T, root, name string, parked time.Time, answering bool) *Record {
	t.Helper()
	dir, err := Dir(root, name)
	if err != nil {
		t.Fatal(err)
	}
	rec := &Record{Name: name, ID: "flmbox-" + name, State: Running, Shape: "s", Pooled: &parked, Dir: dir}
	if err := os.MkdirAll(rec.RunDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(rec); err != nil {
		t.Fatal(err)
	}
	if answering {
		ln, err := net.Listen("unix", rec.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				bufio.NewReader(conn).ReadBytes('\n') // the ping
				fmt.Fprintf(conn, "{\"version\":%d}\n", wire.ProtocolVersion)
				conn.Close()
			}
		}()
	}
	return rec
}

// TestAdopt: FromPool adopts the most recently parked idle sandbox whose
// agent answers, passing over one locked by another process and one whose
// agent does not answer (removed by Discard, left idle without it); the
// record written says it is held (not pooled, the owner, the labels, the
// new name) and its last use is marked; last says whether it was the last
// one idle; a name taken stops FromPool.
func TestAdopt(t *testing.T) {
	root := t.TempDir()
	now := time.Now().UTC()
	old := parkIdle(t, root, "pool-000000000001", now.Add(-3*time.Minute), true)
	parkIdle(t, root, "pool-000000000002", now.Add(-2*time.Minute), true)
	dead := parkIdle(t, root, "pool-000000000003", now.Add(-time.Minute), false)
	locked := parkIdle(t, root, "pool-000000000004", now, true)
	l, err := flock.TryLockDir(locked.Dir, flock.Exclusive) // another process adopting it
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()

	// A caller whose context ended takes nothing and discards nothing.
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	never := Adoption{Discard: func(_ context.Context, rec *Record) { t.Errorf("discarded %s for an ended context", rec.Name) }}
	if got, _, err := never.FromPool(ended, root, "s"); got != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("FromPool with an ended context = %v, %v; want nothing, context.Canceled", got, err)
	}

	// Without Discard, one whose agent does not answer is left idle.
	var warned []error
	a := Adoption{Owned: true, Labels: map[string]string{"k": "v"}, Warn: func(err error) { warned = append(warned, err) }}
	got, last, err := a.FromPool(t.Context(), root, "s")
	if err != nil || got == nil || got.Name != "pool-000000000002" || last {
		t.Fatalf("FromPool = %v, last %v, %v; want pool-000000000002, not the last", got, last, err)
	}
	if rec, err := Read(root, dead.Name); err != nil || rec.Pooled == nil {
		t.Errorf("the sandbox whose agent does not answer, without Discard: %+v, %v; want it idle still", rec, err)
	}
	if len(warned) != 0 {
		t.Errorf("warned %v, want nothing", warned)
	}
	rec, err := Read(root, got.Name)
	self, _ := Self()
	if err != nil || rec.Pooled != nil || rec.Owner == nil || *rec.Owner != *self || rec.Labels["k"] != "v" || rec.LastUsed().IsZero() {
		t.Errorf("the adopted sandbox's record: %+v, %v; want held, owned by this process, labelled, used", rec, err)
	}
	a.Labels["k"] = "changed"
	if got.Labels["k"] != "v" {
		t.Errorf("the record's labels are the caller's map")
	}

	// With Discard, it is removed (told to Warn); a taken name stops.
	var discarded []string
	a = Adoption{
		Discard: func(_ context.Context, rec *Record) { discarded = append(discarded, rec.Name) },
		Warn:    func(err error) { warned = append(warned, err) },
		Rename: func(rec *Record) error {
			return fmt.Errorf("sandbox %q %w", "mine", errdefs.ErrAlreadyExists)
		},
	}
	got, _, err = a.FromPool(t.Context(), root, "s")
	if got != nil || !errdefs.IsAlreadyExists(err) {
		t.Errorf("FromPool renaming to a taken name = %v, %v; want already exists", got, err)
	}
	if !slices.Equal(discarded, []string{dead.Name}) || len(warned) != 1 || !errors.Is(warned[0], ErrDead) {
		t.Errorf("discarded %v, warned %v; want %s removed, its agent dead", discarded, warned, dead.Name)
	}
	if rec, err := Read(root, old.Name); err != nil || rec.Pooled == nil {
		t.Errorf("the sandbox whose rename failed: %+v, %v; want it idle still", rec, err)
	}

	// The last one idle (the locked one and the dead one passed over).
	a = Adoption{Rename: func(rec *Record) error {
		dir, _ := Dir(root, "mine")
		if err := os.Rename(rec.Dir, dir); err != nil {
			return err
		}
		rec.Name, rec.Dir = "mine", dir
		return nil
	}}
	got, last, err = a.FromPool(t.Context(), root, "s")
	if err != nil || got == nil || got.Name != "mine" || !last {
		t.Fatalf("FromPool = %v, last %v, %v; want mine, the last", got, last, err)
	}
	if rec, err := Read(root, "mine"); err != nil || rec.ID != old.ID || rec.Owner != nil || rec.Labels != nil {
		t.Errorf("the renamed sandbox's record: %+v, %v", rec, err)
	}
	if _, err := os.Stat(filepath.Join(root, "sandboxes", old.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("its old directory: %v, want it gone", err)
	}
	if got, _, err := a.FromPool(t.Context(), root, "s"); got != nil || err != nil {
		t.Errorf("FromPool with none to take = %v, %v", got, err)
	}
}
