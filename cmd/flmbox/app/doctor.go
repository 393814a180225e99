package app

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox"
)

// minFreeBytes is the free space below which doctor warns: room for a few
// unpacked Python images.
const minFreeBytes = 2 << 30

// check is one line of doctor's report.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Platforms are gVisor's platforms, each said supported by this host
	// or not (the platforms check's).
	Platforms []runtime.Platform `json:"platforms,omitempty"`
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check that this worker can run flmbox, and say how to fix what is missing",
		Flags: []cli.Flag{jsonFlag},
		Action: func(c *cli.Context) error {
			runsc, info := checkRunsc(c)
			checks := []check{runsc, checkPlatforms(info), checkAgent(c), checkRoot(), checkOpenat2(), checkCgroups(), checkSpace(c.String("root"))}
			failed := 0
			for _, ch := range checks {
				if !ch.OK {
					failed++
				}
			}
			if c.Bool("json") {
				if err := json.NewEncoder(c.App.Writer).Encode(checks); err != nil {
					return err
				}
			} else {
				for _, ch := range checks {
					status := "ok"
					if !ch.OK {
						status = "FAIL"
					}
					fmt.Fprintf(c.App.Writer, "%-4s  %-9s %s\n", status, ch.Name, ch.Detail)
					if ch.Fix != "" {
						fmt.Fprintf(c.App.Writer, "      %-9s fix: %s\n", "", ch.Fix)
					}
				}
			}
			if failed > 0 {
				return cli.Exit(fmt.Sprintf("doctor found %d problem(s)", failed), 1)
			}
			return nil
		},
	}
}

func checkRunsc(c *cli.Context) (check, *runtime.RunscInfo) {
	const fix = "run `make runsc` (builds gVisor's runsc with CGO_ENABLED=0 into /usr/local/bin), or name a runsc binary with --runsc or FLMBOX_RUNSC"
	path, err := runtime.FindRunsc(c.String("runsc"))
	if err != nil {
		return check{Name: "runsc", Detail: err.Error(), Fix: fix}, nil
	}
	info, err := runtime.InspectRunsc(c.Context, path)
	if err != nil {
		return check{Name: "runsc", Detail: err.Error(), Fix: fix}, nil
	}
	return check{Name: "runsc", OK: true, Detail: fmt.Sprintf("%s (version %s, default platform %s)", path, info.Version, info.DefaultPlatform)}, info
}

// checkPlatforms says which gVisor platforms this host runs, and why not
// the others. It fails only if runsc's default platform (info's, if runsc
// answered) is not among them: the others are chosen with --gvisor-platform.
func checkPlatforms(info *runtime.RunscInfo) check {
	var can, cannot []string
	def := ""
	if info != nil {
		def = info.DefaultPlatform
	}
	ok := true
	platforms := runtime.Platforms()
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
	ch := check{Name: "platforms", OK: ok, Detail: detail, Platforms: platforms}
	if !ok && len(can) > 0 {
		ch.Fix = fmt.Sprintf("runsc's default platform %s cannot run here: pass --gvisor-platform %s", def, can[0])
	}
	return ch
}

func checkAgent(c *cli.Context) check {
	m, err := sandbox.Open(c.String("root"))
	if err != nil {
		return check{Name: "agent", Detail: err.Error()}
	}
	p, err := m.Agent()
	if err != nil {
		return check{Name: "agent", Detail: err.Error(), Fix: "run `make build`, and install bin/flmbox, bin/flmbox-core and bin/flmbox-agent in one directory"}
	}
	return check{Name: "agent", OK: true, Detail: p + " (mounted into every sandbox as its first process)"}
}

func checkRoot() check {
	if os.Geteuid() == 0 {
		return check{Name: "root", OK: true, Detail: "running as root"}
	}
	return check{Name: "root", Detail: fmt.Sprintf("running as uid %d", os.Geteuid()),
		Fix: "run flmbox as root: runsc needs it to create sandboxes and the cache keeps images' file owners"}
}

func checkOpenat2() check {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how)
	if err != nil {
		return check{Name: "kernel", Detail: "openat2(RESOLVE_IN_ROOT) is not available: " + err.Error(),
			Fix: "use Linux 5.6 or newer; flmbox needs openat2 to unpack images safely"}
	}
	unix.Close(fd)
	var u unix.Utsname
	_ = unix.Uname(&u)
	return check{Name: "kernel", OK: true, Detail: "Linux " + unix.ByteSliceToString(u.Release[:]) + ", openat2 available"}
}

func checkCgroups() check {
	const fix = "mount the cgroup controllers memory, pids and cpu (cgroup v2 at /sys/fs/cgroup, or v1 hierarchies); sandboxes' limits need them"
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		ctrls := strings.Fields(string(b))
		return cgroupCheck("v2", ctrls, fix)
	}
	var ctrls []string
	for _, name := range []string{"memory", "pids", "cpu"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", name)); err == nil {
			ctrls = append(ctrls, name)
		}
	}
	return cgroupCheck("v1", ctrls, fix)
}

func cgroupCheck(version string, have []string, fix string) check {
	var missing []string
	for _, need := range []string{"memory", "pids", "cpu"} {
		found := false
		for _, h := range have {
			found = found || h == need
		}
		if !found {
			missing = append(missing, need)
		}
	}
	if len(missing) > 0 {
		return check{Name: "cgroups", Detail: fmt.Sprintf("cgroup %s lacks %s", version, strings.Join(missing, ", ")), Fix: fix}
	}
	return check{Name: "cgroups", OK: true, Detail: fmt.Sprintf("cgroup %s with memory, pids, cpu", version)}
}

func checkSpace(root string) check {
	dir := root
	for !exists(dir) && dir != "/" {
		dir = filepath.Dir(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return check{Name: "space", Detail: fmt.Sprintf("statfs %s: %v", dir, err), Fix: "choose a state root on a local file system with --root"}
	}
	free := int64(st.Bavail) * st.Bsize
	detail := fmt.Sprintf("%s free under %s", units.BytesSize(float64(free)), root)
	if free < minFreeBytes {
		return check{Name: "space", Detail: detail, Fix: "free space there, remove images (flmbox images gc), or choose another state root with --root"}
	}
	return check{Name: "space", OK: true, Detail: detail}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
