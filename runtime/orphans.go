package runtime

import (
	"bytes"
	"errors"
	"fmt"
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
//
// Reading every process's command line costs tens of milliseconds on a host
// with hundreds of sandboxes, so it is done only if runsc's root names a
// container that recorded (the caller's IDs, which may be older) does not:
// runsc locks a container's file in its root (ID_sandbox:ID.lock) before it
// starts any of its processes, and removes it only with the container's
// state (runsc delete), so a container whose processes may be left always
// has one there; a container made since recorded was read only costs a
// scan. (Prune, which removes stale lock files, kills every runsc process
// of the root first.)
func (r *Runtime) KillOrphans(recorded map[string]bool, known func() []string) (int, error) {
	inRoot, err := r.rootIDs()
	if err != nil {
		return 0, err
	}
	unknown := false
	for id := range inRoot {
		unknown = unknown || !recorded[id]
	}
	if !unknown {
		return 0, nil
	}
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

// rootIDs returns the IDs of the containers that have a state or lock file
// in runsc's root; a file named otherwise than this runsc names them counts
// as a container no one knows ("?").
func (r *Runtime) rootIDs() (map[string]bool, error) {
	ents, err := os.ReadDir(r.root)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("read runsc's state directory: %w", err)
	}
	ids := map[string]bool{}
	for _, e := range ents {
		if e.Name() == createLock {
			continue
		}
		if id, ok := rootFileID(e.Name(), ".state", ".lock"); ok {
			ids[id] = true
		} else if id != "" {
			ids["?"] = true
		}
	}
	return ids, nil
}

// rootFileID returns the container ID of a file in runsc's root
// (ID_sandbox:SANDBOX-ID.SUFFIX) with one of suffixes; ok false, and the
// name, if it has one of them but is not named so; "" if it has none.
func rootFileID(name string, suffixes ...string) (id string, ok bool) {
	for _, suf := range suffixes {
		if n, has := strings.CutSuffix(name, suf); has {
			id, _, ok := strings.Cut(n, "_sandbox:")
			if !ok || id == "" {
				return name, false
			}
			return id, true
		}
	}
	return "", false
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
