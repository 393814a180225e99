package record

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/snippet/wire"
)

func TestRecord(t *testing.T) {
	root := t.TempDir()
	dir, err := Dir(root, "sb-1")
	if err != nil || dir != filepath.Join(root, "sandboxes", "sb-1") {
		t.Fatalf("Dir: %q %v", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	want := &Record{Name: "sb-1", ID: "flmbox-0123", Network: "none", Limits: Limits{MemoryBytes: 3 << 28, CPUs: 1, Pids: 100},
		State: Running, Created: time.Now().UTC().Truncate(time.Second), Dir: dir, HandOut: "h", Labels: map[string]string{"team": "ml"}}
	if err := Write(want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(root, "sb-1")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, want)
	}
	if l := got.SnippetLimits(); l != (wire.Limits{Procs: 100}) {
		t.Errorf("SnippetLimits = %+v", l)
	}
	if got.SocketPath() != filepath.Join(dir, "run", "agent.sock") {
		t.Errorf("SocketPath = %s", got.SocketPath())
	}
	if err := got.Callable(); err != nil {
		t.Errorf("a running sandbox is not callable: %v", err)
	}
	got.State = Creating
	if err := got.Callable(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a sandbox being created is callable: %v", err)
	}
	if !got.LastUsed().Equal(want.Created) {
		t.Errorf("LastUsed before any call = %v, want its creation", got.LastUsed())
	}
	got.Touch()
	if !got.LastUsed().After(want.Created) {
		t.Errorf("LastUsed after Touch = %v", got.LastUsed())
	}
	if _, err := Read(root, "nosuch"); !errdefs.IsNotFound(err) {
		t.Errorf("Read of a missing sandbox: %v", err)
	}
	for _, bad := range []string{"", "../sb-1", "sb/1", ".hidden", "-x"} {
		if _, err := Read(root, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Read(%q): %v", bad, err)
		}
	}
	os.WriteFile(filepath.Join(dir, "sandbox.json"), []byte("{"), 0o600)
	if _, err := Read(root, "sb-1"); !errdefs.IsDataLoss(err) {
		t.Errorf("a damaged record: %v", err)
	}
}

func TestErrDead(t *testing.T) {
	if !errors.Is(ErrDead, errdefs.ErrFailedPrecondition) || !errdefs.IsFailedPrecondition(ErrDead) || errdefs.IsUnavailable(ErrDead) {
		t.Fatal("ErrDead is not errdefs.ErrFailedPrecondition alone")
	}
}

// TestHungUpIsDead: an agent that reads the request and hangs up died (it
// answers every request it reads); its sandbox goes with it, though its
// socket may accept connections for a moment still: the call's error says
// the sandbox is dead.
func TestHungUpIsDead(t *testing.T) {
	root := t.TempDir()
	dir, _ := Dir(root, "sb-1")
	rec := &Record{Name: "sb-1", ID: "flmbox-0123", State: Running, Dir: dir}
	if err := os.MkdirAll(rec.RunDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(rec); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", rec.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		bufio.NewReader(conn).ReadBytes('\n') // the request
		conn.Close()                          // hung up
		time.Sleep(100 * time.Millisecond)    // the sandbox takes a moment to go
		ln.Close()
	}()
	t.Cleanup(func() { ln.Close() })
	req := &wire.Request{Version: wire.ProtocolVersion, Language: wire.LanguagePython, Code: "1", TimeoutMS: 60000}
	_, err = rec.Call(t.Context(), req)
	if !errors.Is(err, ErrDead) || !errors.Is(err, wire.ErrHungUp) {
		t.Fatalf("Call = %v, want ErrDead and wire.ErrHungUp", err)
	}
}

func TestUseMarksACall(t *testing.T) {
	r := &Record{Dir: t.TempDir(), Created: time.Now().Add(-time.Hour)}
	if r.InCall() {
		t.Fatal("InCall before any call")
	}
	before := time.Now().Add(-time.Second)
	done := r.Use()
	if !r.InCall() {
		t.Fatal("InCall is false during a call")
	}
	if !r.LastUsed().After(before) {
		t.Errorf("LastUsed %s, want after %s", r.LastUsed(), before)
	}
	other := r.Use() // a second call at once
	done()
	if !r.InCall() {
		t.Fatal("InCall is false while the second call runs")
	}
	other()
	if r.InCall() {
		t.Fatal("InCall after both calls ended")
	}
}

// TestRemovedIsNotFoundOnly: a call whose sandbox was removed fails with
// one kind, not found, whatever its cause said (an unavailable agent).
func TestRemovedIsNotFoundOnly(t *testing.T) {
	root := t.TempDir()
	r := &Record{Name: "gone", ID: "flmbox-0123", Dir: filepath.Join(root, "sandboxes", "gone")}
	err := r.explain(context.Background(), fmt.Errorf("the agent: %w", errdefs.ErrUnavailable))
	if !errors.Is(err, ErrRemoved) || !errdefs.IsNotFound(err) || errdefs.IsUnavailable(err) {
		t.Fatalf("explain of a removed sandbox's call: %v", err)
	}
}
