package record

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// TestPooledRecord: a record's pool fields read back as written; ReadDir
// reads a record whatever name it holds, where Read refuses one that names
// another directory; Renamed tells the two apart; an idle pooled sandbox
// takes no calls, and takes them again once adopted (Pooled nil).
func TestPooledRecord(t *testing.T) {
	root := t.TempDir()
	dir, err := Dir(root, "pool-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	parked := time.Now().UTC().Truncate(time.Millisecond)
	rec := &Record{Name: "pool-0123456789ab", ID: "flmbox-0123", State: Running, Shape: "5333c23123dcbdfc", Pooled: &parked,
		Lease: "pool-ffffffffffff.flmbox-0123", Dir: dir}
	if err := Write(rec); err != nil {
		t.Fatal(err)
	}
	got, err := Read(root, rec.Name)
	if err != nil || got.Shape != rec.Shape || got.Pooled == nil || !got.Pooled.Equal(parked) || got.Lease != rec.Lease {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, rec)
	}
	if got.Renamed() {
		t.Errorf("a record in its own directory is Renamed")
	}
	err = got.Callable()
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "idle in a pool") {
		t.Errorf("Callable of an idle pooled sandbox: %v, want failed precondition saying it is idle in a pool", err)
	}
	got.Pooled = nil
	if err := got.Callable(); err != nil {
		t.Errorf("Callable of an adopted sandbox: %v", err)
	}

	// An Acquire killed between renaming the directory and writing the
	// record: the directory is work, the record still says pool-….
	work := stateroot.Sandbox(root, "work")
	if err := os.Rename(dir, work); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(root, "work"); !errdefs.IsDataLoss(err) {
		t.Errorf("Read of a renamed sandbox: %v, want data loss", err)
	}
	if _, err := Read(root, rec.Name); !errdefs.IsNotFound(err) {
		t.Errorf("Read under its old name: %v, want not found", err)
	}
	got, err = ReadDir(work)
	if err != nil || got.Name != rec.Name || got.Dir != work || got.ID != rec.ID {
		t.Fatalf("ReadDir = %+v, %v", got, err)
	}
	if !got.Renamed() {
		t.Errorf("a record naming another directory is not Renamed: %+v", got)
	}
	if _, err := ReadDir(stateroot.Sandbox(root, "nosuch")); !errdefs.IsNotFound(err) {
		t.Errorf("ReadDir of a missing directory: %v, want not found", err)
	}
	if err := os.WriteFile(filepath.Join(work, "sandbox.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDir(work); !errdefs.IsDataLoss(err) {
		t.Errorf("ReadDir of a damaged record: %v, want data loss", err)
	}

	// A record written before pools has none of their fields.
	old := stateroot.Sandbox(root, "old")
	os.MkdirAll(old, 0o700)
	os.WriteFile(filepath.Join(old, "sandbox.json"), []byte(`{"name":"old","id":"flmbox-1","state":"running"}`), 0o600)
	got, err = Read(root, "old")
	if err != nil || got.Shape != "" || got.Pooled != nil || got.Lease != "" || got.Callable() != nil {
		t.Errorf("a record of before pools: %+v, %v", got, err)
	}
}
