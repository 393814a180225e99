package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestArgs(t *testing.T) {
	r := &Runtime{runsc: "runsc", root: "/var/lib/flmbox/runsc"}
	c := Container{ID: "flmbox-0123", Network: NetworkHost, Platform: "ptrace"}
	got := r.Args(c, "exec", c.ID, "true")
	want := []string{"--root", "/var/lib/flmbox/runsc", "--network=host", "--host-uds=create", "--platform=ptrace", "exec", "flmbox-0123", "true"}
	if !slices.Equal(got, want) {
		t.Fatalf("Args = %q, want %q", got, want)
	}
	inv := r.command(Container{ID: "flmbox-4567", Network: NetworkNone}, "delete", "--force", "flmbox-4567")
	want = []string{"--root", "/var/lib/flmbox/runsc", "--network=none", "--host-uds=create", "delete", "--force", "flmbox-4567"}
	if inv.bin != "runsc" || inv.sub != "delete" || !slices.Equal(inv.args, want) {
		t.Fatalf("command: %s %q (%s), want %q", inv.bin, inv.args, inv.sub, want)
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
