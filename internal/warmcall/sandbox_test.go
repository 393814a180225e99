package warmcall

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/flmbox/flmbox/runtime"
)

// TestOpenReadsWhatRuntimeWrites keeps Sandbox in step with runtime.Sandbox,
// the record it reads without importing package runtime.
func TestOpenReadsWhatRuntimeWrites(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sandboxes", "sb-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	want := runtime.Sandbox{Name: "sb-1", ID: "flmbox-0123", Limits: runtime.Limits{MemoryBytes: 3 << 28, CPUs: 1, Pids: 100}}
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sandbox.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	rsb, err := runtime.GetSandbox(root, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := Open(root, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.Dir != rsb.Dir || sb.Limits.MemoryBytes != want.Limits.MemoryBytes || sb.Limits.Pids != want.Limits.Pids {
		t.Errorf("Open = %+v, runtime has %+v", sb, rsb)
	}
	if got, want := SocketPath(sb.Dir), filepath.Join(rsb.RunPath(), "agent.sock"); got != want {
		t.Errorf("SocketPath = %s, want %s (in the run directory that runtime mounts)", got, want)
	}
	if l := SnippetLimits(sb.Limits.MemoryBytes, sb.Limits.Pids); l.MemoryBytes != 3<<27 || l.Procs != 25 {
		t.Errorf("SnippetLimits = %+v", l)
	}
	for _, bad := range []string{"", "../sb-1", "sb/1", "nosuch"} {
		if _, err := Open(root, bad); err == nil {
			t.Errorf("Open(%q) succeeded", bad)
		}
	}
}
