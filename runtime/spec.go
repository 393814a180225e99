package runtime

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SpecOpt edits a sandbox's OCI runtime spec. Specs are built by applying
// small SpecOpts in order to a default spec (GenerateSpec), as containerd's
// pkg/oci does.
type SpecOpt func(*specs.Spec) error

// Network is a sandbox's network mode.
type Network string

// Network modes.
const (
	// NetworkNone gives the sandbox only a loopback interface.
	NetworkNone Network = "none"
	// NetworkHost lets the sandbox use the host's network through gVisor's
	// network stack pass-through.
	NetworkHost Network = "host"
	// NetworkSandbox runs gVisor's own network stack on the links of the
	// network namespace the spec names (WithNetNS): runsc takes their
	// addresses and routes for its stack.
	NetworkSandbox Network = "sandbox"
)

// ParseNetwork validates a --network value.
func ParseNetwork(s string) (Network, error) {
	switch n := Network(s); n {
	case NetworkNone, NetworkHost, NetworkSandbox:
		return n, nil
	}
	return "", fmt.Errorf("network %q: want none, host or sandbox: %w", s, errdefs.ErrInvalidArgument)
}

// GenerateSpec returns the default sandbox spec with opts applied: no
// capabilities, no new privileges, user 65534:65534, working directory /tmp,
// the standard /proc, /dev, /dev/pts, /dev/shm and /sys mounts, and new PID,
// IPC, UTS and mount namespaces (and network, unless WithNetwork(host)).
func GenerateSpec(opts ...SpecOpt) (*specs.Spec, error) {
	s := &specs.Spec{
		Version:  specs.Version,
		Hostname: "sandbox",
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			User:            specs.User{UID: 65534, GID: 65534},
			Cwd:             "/tmp",
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
			},
			Resources: &specs.LinuxResources{},
		},
	}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// WithCwd sets the working directory of the container's first process
// (and so of what it starts), an absolute path.
func WithCwd(dir string) SpecOpt {
	return func(s *specs.Spec) error {
		if !strings.HasPrefix(dir, "/") {
			return fmt.Errorf("working directory %q: want an absolute path: %w", dir, errdefs.ErrInvalidArgument)
		}
		s.Process.Cwd = dir
		return nil
	}
}

// WithRootfs sets the root file system, read-only.
func WithRootfs(path string) SpecOpt {
	return func(s *specs.Spec) error {
		s.Root = &specs.Root{Path: path, Readonly: true}
		return nil
	}
}

// WithTmp mounts a writable tmpfs of size bytes on /tmp.
func WithTmp(size int64) SpecOpt {
	return func(s *specs.Spec) error {
		if size <= 0 {
			return fmt.Errorf("tmp size %d: want a positive size: %w", size, errdefs.ErrInvalidArgument)
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", size)}})
		return nil
	}
}

// WithBind bind-mounts host path src at dst inside the sandbox.
func WithBind(src, dst string, readonly bool) SpecOpt {
	return func(s *specs.Spec) error {
		opts := []string{"rbind", "nosuid", "nodev"}
		if readonly {
			opts = append(opts, "ro")
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: opts})
		return nil
	}
}

// WithHostname sets the sandbox's host name (default "sandbox").
func WithHostname(name string) SpecOpt {
	return func(s *specs.Spec) error {
		s.Hostname = name
		return nil
	}
}

// WithUser sets the user the sandbox's processes run as.
func WithUser(uid, gid uint32) SpecOpt {
	return func(s *specs.Spec) error {
		s.Process.User = specs.User{UID: uid, GID: gid}
		return nil
	}
}

// WithCapabilities gives the sandbox's first process the capabilities caps
// (bounding, effective and permitted; none inheritable or ambient). With
// root as the user, the processes it execs keep them too.
func WithCapabilities(caps ...string) SpecOpt {
	return func(s *specs.Spec) error {
		for _, c := range caps {
			if !strings.HasPrefix(c, "CAP_") {
				return fmt.Errorf("capability %q: want a name like CAP_KILL: %w", c, errdefs.ErrInvalidArgument)
			}
		}
		c := append([]string(nil), caps...)
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: c, Effective: c, Permitted: c}
		return nil
	}
}

// WithArgs sets the sandbox's first process.
func WithArgs(args ...string) SpecOpt {
	return func(s *specs.Spec) error {
		if len(args) == 0 {
			return fmt.Errorf("a sandbox needs a first process: %w", errdefs.ErrInvalidArgument)
		}
		s.Process.Args = args
		return nil
	}
}

// WithEnv sets the environment, in order; later entries override earlier
// ones with the same name. The host's environment is never inherited.
func WithEnv(env []string) SpecOpt {
	return func(s *specs.Spec) error {
		var out []string
		index := map[string]int{}
		for _, kv := range env {
			k, _, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("environment entry %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
			}
			if i, seen := index[k]; seen {
				out[i] = kv
				continue
			}
			index[k] = len(out)
			out = append(out, kv)
		}
		s.Process.Env = out
		return nil
	}
}

// WithNetwork selects the network mode. With NetworkHost the sandbox keeps
// the host's network namespace.
func WithNetwork(n Network) SpecOpt {
	return func(s *specs.Spec) error {
		if _, err := ParseNetwork(string(n)); err != nil {
			return err
		}
		if n == NetworkHost {
			var ns []specs.LinuxNamespace
			for _, x := range s.Linux.Namespaces {
				if x.Type != specs.NetworkNamespace {
					ns = append(ns, x)
				}
			}
			s.Linux.Namespaces = ns
		}
		return nil
	}
}

// WithNetNS names the network namespace the sandbox joins
// (NetworkSandbox), a path to a bind-mounted namespace.
func WithNetNS(path string) SpecOpt {
	return func(s *specs.Spec) error {
		for i, x := range s.Linux.Namespaces {
			if x.Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = path
				return nil
			}
		}
		return fmt.Errorf("join network namespace %s: the spec has none: %w", path, errdefs.ErrInvalidArgument)
	}
}

// Limits bound a whole sandbox through its cgroup. They are the sandbox's
// backstop: snippets are bounded more tightly from inside, by rlimits on
// their own processes and by the agent's memory watch, so that one snippet
// cannot kill the sandbox.
type Limits struct {
	// MemoryBytes is the memory of the sandbox's processes and its /tmp
	// together (0: no limit). The cgroup's limit is MemoryBytes +
	// MemoryHeadroom(MemoryBytes): gVisor's own memory is not the
	// snippets', and the agent's memory watch must act before the cgroup
	// kills the whole sandbox.
	MemoryBytes int64 `json:"memory_bytes"`
	// CPUs is the CPU quota in CPUs (0: none).
	CPUs float64 `json:"cpus"`
	// Pids is the limit on processes and threads (0: none). The cgroup's
	// limit is Pids + PidsHeadroom(Pids): the host counts gVisor's own
	// threads and stub processes, not the sandbox's processes.
	Pids int64 `json:"pids"`
}

// PidsHeadroom is what a sandbox's pids cgroup allows above its Pids: three
// times Pids, plus 128, for gVisor's own threads and stub processes, which
// the host counts and the snippets' RLIMIT_NPROC does not. It is a backstop
// against a runaway sentry, beyond what snippets can reach (figures in
// docs/PERFORMANCE.md, "Limits' floors").
func PidsHeadroom(pids int64) int64 { return 3*pids + 128 }

// MemoryHeadroom is what a sandbox's cgroup allows above its MemoryBytes: a
// quarter, 256 to 512 MiB. It holds gVisor's own memory and what snippets
// grow by before the agent's memory watch has killed them (figures in
// docs/PERFORMANCE.md, "Limits' floors").
func MemoryHeadroom(memoryBytes int64) int64 { return min(max(memoryBytes/4, 256<<20), 512<<20) }

// InodeBytes is what one inode of a sandbox's tmpfs (/tmp, /dev/shm) counts
// in the agent's memory watch (flmbox-agent --inode-bytes): a file's metadata
// is gVisor's own memory, shown neither in the sandbox's /proc/meminfo nor in
// the tmpfs's size, and costs up to some 9 KiB (docs/PERFORMANCE.md).
const InodeBytes = 10 << 10

// WithLimits sets the sandbox's cgroup limits, and the memory Run shows
// the sandbox as its MemTotal: MemoryBytes (AnnotationMemory, see
// bootBundle).
func WithLimits(l Limits) SpecOpt {
	return func(s *specs.Spec) error {
		if l.MemoryBytes < 0 || l.CPUs < 0 || l.Pids < 0 {
			return fmt.Errorf("limits must not be negative: %w", errdefs.ErrInvalidArgument)
		}
		r := s.Linux.Resources
		if l.MemoryBytes > 0 {
			m := l.MemoryBytes + MemoryHeadroom(l.MemoryBytes)
			r.Memory = &specs.LinuxMemory{Limit: &m}
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[AnnotationMemory] = strconv.FormatInt(l.MemoryBytes, 10)
		}
		if l.CPUs > 0 {
			period := uint64(100_000)
			quota := int64(l.CPUs * float64(period))
			r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
		}
		if l.Pids > 0 {
			n := l.Pids + PidsHeadroom(l.Pids)
			r.Pids = &specs.LinuxPids{Limit: &n}
		}
		return nil
	}
}
