package sandbox

import (
	"slices"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/runtime"
)

// TestBareSpec checks that the bare runsc baseline gets what a sandbox gets
// by default: limits, /tmp, user, environment, no network.
func TestBareSpec(t *testing.T) {
	s, err := bareSpec(Spec{Image: "img"}, "/rootfs", []string{"PATH=/usr/bin", "PYTHONPATH=/opt"}, "sleep", "infinity")
	if err != nil {
		t.Fatal(err)
	}
	r := s.Linux.Resources
	if want := DefaultLimits.Pids + runtime.PidsHeadroom(DefaultLimits.Pids); r.Pids == nil || *r.Pids.Limit != want {
		t.Errorf("pids %+v", r.Pids)
	}
	if want := DefaultLimits.MemoryBytes + runtime.MemoryHeadroom(DefaultLimits.MemoryBytes); r.Memory == nil || *r.Memory.Limit != want {
		t.Errorf("memory %+v, want %d", r.Memory, want)
	}
	if r.CPU == nil || *r.CPU.Quota != int64(DefaultLimits.CPUs*100_000) {
		t.Errorf("cpu %+v", r.CPU)
	}
	if s.Root.Path != "/rootfs" || !s.Root.Readonly {
		t.Errorf("root %+v", s.Root)
	}
	if u := s.Process.User; u.UID != UID || u.GID != GID {
		t.Errorf("user %+v", u)
	}
	if !slices.Equal(s.Process.Args, []string{"sleep", "infinity"}) {
		t.Errorf("args %q", s.Process.Args)
	}
	if !slices.Equal(s.Process.Env, Environment([]string{"PATH=/usr/bin", "PYTHONPATH=/opt"}, nil)) {
		t.Errorf("env %q", s.Process.Env)
	}
	var tmp string
	for _, m := range s.Mounts {
		if m.Destination == "/tmp" {
			tmp = strings.Join(m.Options, ",")
		}
	}
	if !strings.Contains(tmp, "size=268435456") {
		t.Errorf("/tmp options %q", tmp)
	}
	netns := false
	for _, ns := range s.Linux.Namespaces {
		netns = netns || ns.Type == "network"
	}
	if !netns {
		t.Error("no network namespace")
	}
}
