package runtime

import (
	"slices"
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
