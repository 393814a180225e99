package runtime

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KillOrphans kills the runsc processes of this Runtime's root (sandbox
// and gofer processes; a sandbox's own children go with it) whose container
// ID is not among known(), removes those containers' cgroups, and returns
// how many containers it killed. A runsc run killed while it was creating
// a container can leave them running with no state in runsc's root, so
// that runsc neither lists nor deletes them.
// known is called after the processes are listed, so that a container being
// made meanwhile (its ID known before its processes exist) is never killed.
func (r *Runtime) KillOrphans(known func() []string) (int, error) {
	procs, err := r.processes()
	if err != nil || len(procs) == 0 {
		return 0, err
	}
	k := known()
	ids := killContainers(procs, func(id string) bool { return strings.HasPrefix(id, "flmbox-") && !slices.Contains(k, id) })
	var errs []error
	for _, id := range ids {
		errs = append(errs, removeCgroups(cgroupName("", id)))
	}
	return len(ids), errors.Join(errs...)
}

// killContainers SIGKILLs the processes of procs (processes' map) whose
// container ID match says yes to, and returns those IDs, once each.
func killContainers(procs map[int]string, match func(id string) bool) []string {
	var ids []string
	for pid, id := range procs {
		if match(id) {
			unix.Kill(pid, unix.SIGKILL) // gone already is as good
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// processes returns runsc's sandbox and gofer processes whose command line
// names this Runtime's root, by pid, with the container ID that ends their command
// line.
func (r *Runtime) processes() (map[int]string, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimSuffix(b, []byte{0})), "\x00")
		// runsc's long-lived processes name themselves so; runsc commands
		// (a delete at work) are left alone.
		if len(args) >= 2 && (args[0] == "runsc-sandbox" || args[0] == "runsc-gofer") && namesRoot(args, r.root) {
			out[pid] = args[len(args)-1]
		}
	}
	return out, nil
}

// namesRoot says whether a runsc command line has --root=root or --root
// root among its flags.
func namesRoot(args []string, root string) bool {
	for i, a := range args {
		if a == "--root="+root || a == "-root="+root || (a == "--root" || a == "-root") && i+1 < len(args) && args[i+1] == root {
			return true
		}
	}
	return false
}
