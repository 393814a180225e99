package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRunscArgs(t *testing.T) {
	sb := &Sandbox{ID: "flmbox-0123", Network: NetworkHost, Platform: "ptrace"}
	got := RunscArgs("/var/lib/flmbox", sb, "exec", sb.ID, "true")
	want := []string{"--root", "/var/lib/flmbox/runsc", "--network=host", "--host-uds=create", "--platform=ptrace", "exec", "flmbox-0123", "true"}
	if !slices.Equal(got, want) {
		t.Fatalf("RunscArgs = %q, want %q", got, want)
	}
	r := &Runtime{runsc: "runsc", dir: "/var/lib/flmbox"}
	rc := r.runc(&Sandbox{Network: NetworkNone})
	if rc.Root != "/var/lib/flmbox/runsc" || !slices.Equal(rc.ExtraArgs, []string{"--network=none", "--host-uds=create"}) {
		t.Fatalf("runc driver: root %q, flags %q", rc.Root, rc.ExtraArgs)
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
