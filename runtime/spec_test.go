package runtime

import (
	"errors"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestGenerateSpecDefaultsAreLockedDown(t *testing.T) {
	s, err := GenerateSpec(WithRootfs("/cache/rootfs"), WithTmp(256<<20), WithArgs("/bin/true"))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly || s.Root.Path != "/cache/rootfs" {
		t.Errorf("root %+v: want the cached rootfs, read-only", s.Root)
	}
	p := s.Process
	if p.User.UID != 65534 || p.User.GID != 65534 || !p.NoNewPrivileges || p.Cwd != "/tmp" {
		t.Errorf("process %+v", p)
	}
	c := p.Capabilities
	if len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("capabilities %+v: want none", c)
	}
	if len(p.Env) != 0 {
		t.Errorf("env %v: the host's environment must never leak in", p.Env)
	}
	var tmp *specs.Mount
	for i := range s.Mounts {
		if s.Mounts[i].Destination == "/tmp" {
			tmp = &s.Mounts[i]
		}
	}
	if tmp == nil || tmp.Type != "tmpfs" || !slices.Contains(tmp.Options, "size=268435456") {
		t.Errorf("/tmp mount %+v", tmp)
	}
	if !hasNamespace(s, specs.NetworkNamespace) {
		t.Error("the default network must be none: a network namespace of its own")
	}
}

func hasNamespace(s *specs.Spec, typ specs.LinuxNamespaceType) bool {
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == typ {
			return true
		}
	}
	return false
}

func TestWithNetworkHostDropsTheNamespace(t *testing.T) {
	s, err := GenerateSpec(WithNetwork(NetworkHost))
	if err != nil || hasNamespace(s, specs.NetworkNamespace) || !hasNamespace(s, specs.PIDNamespace) {
		t.Fatalf("host network: %v %+v", err, s.Linux.Namespaces)
	}
	if _, err := GenerateSpec(WithNetwork("bridge")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown network: %v", err)
	}
}

func TestWithEnvLaterWins(t *testing.T) {
	s, err := GenerateSpec(WithEnv([]string{"A=1", "B=2", "A=3"}))
	if err != nil || !slices.Equal(s.Process.Env, []string{"A=3", "B=2"}) {
		t.Fatalf("env %v %v", s.Process.Env, err)
	}
	for _, bad := range []string{"NOEQUALS", "=v"} {
		if _, err := GenerateSpec(WithEnv([]string{bad})); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestWithLimits(t *testing.T) {
	s, err := GenerateSpec(WithLimits(Limits{MemoryBytes: 512 << 20, CPUs: 1.5, Pids: 256}))
	if err != nil {
		t.Fatal(err)
	}
	r := s.Linux.Resources
	if *r.Memory.Limit != (512+256)<<20 || *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 || *r.Pids.Limit != 4*256+128 {
		t.Fatalf("resources %+v", r)
	}
	if _, err := GenerateSpec(WithLimits(Limits{Pids: -1})); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
	if _, err := GenerateSpec(WithTmp(0)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
	if _, err := GenerateSpec(WithArgs()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
}
