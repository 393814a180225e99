package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/docker/go-units"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/egress"
)

// MinFreeBytes is the free space under a state root below which Doctor's
// space check fails: room for a few unpacked Python images.
const MinFreeBytes = 2 << 30

// Check is one of Doctor's findings.
type Check struct {
	// Name says what was checked: CheckRunsc, CheckPlatforms, ...
	Name string `json:"name"`
	// OK says that this host passes the check; Detail what was found.
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Platforms are gVisor's platforms, each said supported by this host
	// or not (CheckPlatforms'); DefaultPlatform is runsc's, if runsc
	// answered.
	Platforms       []Platform `json:"platforms,omitempty"`
	DefaultPlatform string     `json:"-"`
}

// Doctor's checks, by Check.Name.
const (
	CheckRunsc     = "runsc"     // a runsc that answers
	CheckPlatforms = "platforms" // runsc's default platform runs here
	CheckAgent     = "agent"     // the agent binary is there
	CheckRoot      = "root"      // running as root
	CheckKernel    = "kernel"    // openat2(RESOLVE_IN_ROOT), for unpacking
	CheckCgroups   = "cgroups"   // the memory, pids and cpu controllers
	CheckSpace     = "space"     // MinFreeBytes free under the state root
	CheckEgress    = "egress"    // egress networks can be made (NetworkEgress)
)

// Doctor checks that this host can run the Manager's sandboxes, and says
// what it found, one Check per thing checked, in the order of the Check*
// constants. It changes nothing.
func (m *Manager) Doctor(ctx context.Context) []Check {
	runsc, info := m.checkRunsc(ctx)
	return []Check{runsc, checkPlatforms(info), m.checkAgent(), checkRoot(), checkKernel(), checkCgroups(), checkSpace(m.root), m.checkEgress()}
}

// checkEgress checks what egress sandboxes need: their resolver binary,
// nftables, addresses no route of the host's takes, forwarding no other
// table drops.
func (m *Manager) checkEgress() Check {
	if _, err := m.Resolver(); err != nil {
		return Check{Name: CheckEgress, Detail: err.Error()}
	}
	detail, err := egress.Check()
	if err != nil {
		return Check{Name: CheckEgress, Detail: err.Error()}
	}
	return Check{Name: CheckEgress, OK: true, Detail: detail}
}

func (m *Manager) checkRunsc(ctx context.Context) (Check, *Runsc) {
	info, err := m.Runsc(ctx)
	if err != nil {
		return Check{Name: CheckRunsc, Detail: err.Error()}, nil
	}
	return Check{Name: CheckRunsc, OK: true, Detail: fmt.Sprintf("%s (version %s, default platform %s)", info.Path, info.Version, info.DefaultPlatform)}, info
}

// checkPlatforms says which gVisor platforms this host runs, and why not
// the others. It fails only if runsc's default platform (info's, if runsc
// answered) is not among them: the others are chosen with Spec.Platform.
func checkPlatforms(info *Runsc) Check {
	var can, cannot []string
	def := ""
	if info != nil {
		def = info.DefaultPlatform
	}
	ok := true
	platforms := Platforms()
	for _, p := range platforms {
		if p.Supported {
			can = append(can, p.Name)
			continue
		}
		cannot = append(cannot, fmt.Sprintf("not %s: %s", p.Name, p.Reason))
		if p.Name == def {
			ok = false
		}
	}
	detail := "this host runs " + strings.Join(can, ", ")
	if len(cannot) > 0 {
		detail += "; " + strings.Join(cannot, "; ")
	}
	return Check{Name: CheckPlatforms, OK: ok, Detail: detail, Platforms: platforms, DefaultPlatform: def}
}

func (m *Manager) checkAgent() Check {
	p, err := m.Agent()
	if err != nil {
		return Check{Name: CheckAgent, Detail: err.Error()}
	}
	return Check{Name: CheckAgent, OK: true, Detail: p + " (mounted into every sandbox as its first process)"}
}

func checkRoot() Check {
	if os.Geteuid() == 0 {
		return Check{Name: CheckRoot, OK: true, Detail: "running as root"}
	}
	return Check{Name: CheckRoot, Detail: fmt.Sprintf("running as uid %d", os.Geteuid())}
}

func checkKernel() Check {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how)
	if err != nil {
		return Check{Name: CheckKernel, Detail: "openat2(RESOLVE_IN_ROOT) is not available: " + err.Error()}
	}
	unix.Close(fd)
	var u unix.Utsname
	_ = unix.Uname(&u)
	return Check{Name: CheckKernel, OK: true, Detail: "Linux " + unix.ByteSliceToString(u.Release[:]) + ", openat2 available"}
}

func checkCgroups() Check {
	version, have := "v2", []string(nil)
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		have = strings.Fields(string(b))
	} else {
		version = "v1"
		for _, name := range []string{"memory", "pids", "cpu"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", name)); err == nil {
				have = append(have, name)
			}
		}
	}
	var missing []string
	for _, need := range []string{"memory", "pids", "cpu"} {
		if !slices.Contains(have, need) {
			missing = append(missing, need)
		}
	}
	if len(missing) > 0 {
		return Check{Name: CheckCgroups, Detail: fmt.Sprintf("cgroup %s lacks %s", version, strings.Join(missing, ", "))}
	}
	return Check{Name: CheckCgroups, OK: true, Detail: fmt.Sprintf("cgroup %s with memory, pids, cpu", version)}
}

func checkSpace(root string) Check {
	dir := root
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Check{Name: CheckSpace, Detail: fmt.Sprintf("statfs %s: %v", dir, err)}
	}
	free := int64(st.Bavail) * st.Bsize
	detail := fmt.Sprintf("%s free under %s", units.BytesSize(float64(free)), root)
	return Check{Name: CheckSpace, OK: free >= MinFreeBytes, Detail: detail}
}
