package runtime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/testrig/testprog"
)

func TestArgs(t *testing.T) {
	r := &Runtime{runsc: "runsc", root: "/var/lib/flmbox/runsc"}
	c := Container{ID: "flmbox-0123", Network: NetworkHost, Platform: "ptrace"}
	got := r.Args(c, "exec", c.ID, "true")
	want := []string{"--root", "/var/lib/flmbox/runsc", "--network=host", "--host-uds=create", "--platform=ptrace", "exec", "flmbox-0123", "true"}
	if !slices.Equal(got, want) {
		t.Fatalf("Args = %q, want %q", got, want)
	}
}

// TestRuncCommandLines: the runsc commands go-runc runs for the Runtime
// have runsc's global flags as Args gives them, then the command's own.
func TestRuncCommandLines(t *testing.T) {
	dir := t.TempDir()
	runsc, argv := filepath.Join(dir, "runsc"), filepath.Join(dir, "argv")
	script := "#!/bin/sh\necho \"$*\" >> " + argv + "\n"
	testprog.Write(t, runsc, []byte(script))
	r, err := NewRuntime(runsc, filepath.Join(dir, "root"))
	if err != nil {
		t.Fatal(err)
	}
	c := Container{ID: "flmbox-4567", Network: NetworkNone}
	if err := r.Delete(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if err := r.Checkpoint(context.Background(), c, "/img", true); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(argv)
	if err != nil {
		t.Fatal(err)
	}
	global := "--root " + r.root + " --network=none --host-uds=create "
	want := []string{global + "kill --all flmbox-4567 9", global + "delete --force flmbox-4567",
		global + "checkpoint --image-path /img --leave-running flmbox-4567"}
	if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, want) {
		t.Fatalf("runsc ran\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNewIDsHaveOneLength(t *testing.T) {
	a, b := NewID(), NewID()
	if a == b || len(a) != len(b) || !strings.HasPrefix(a, "flmbox-") {
		t.Fatalf("NewID: %q, %q", a, b)
	}
}

func TestLogTail(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, want string
	}{
		{"missing", "", ""},
		{"blank", " \n\n", ""},
		{"short", "boom: no such file\n", ": boom: no such file"},
		{"long", strings.Repeat("x", 5000) + "the end\n", ": " + strings.Repeat("x", 2<<10-len("the end\n")) + "the end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if tc.name != "missing" {
				if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := logTail(p); got != tc.want {
				t.Errorf("logTail = %q, want %q", got, tc.want)
			}
		})
	}
}
