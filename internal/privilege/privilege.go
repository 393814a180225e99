// Package privilege says whether this process can make and take
// sandboxes: runsc (as flmbox runs it) and a sandbox's run directory's
// tmpfs need root with CAP_SYS_ADMIN. Package sandbox and the flmbox
// command ask it alike, so that they give one answer, also when
// /proc/self/status cannot be read (then the operation itself says what
// fails).
package privilege

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// capSysAdmin is CAP_SYS_ADMIN's bit: mounting a sandbox's run directory and
// runsc's own sandboxing need it.
const capSysAdmin = 21

// Check fails, with errdefs.ErrPermissionDenied, unless this process runs
// as root with CAP_SYS_ADMIN; doing is what it is about to do, as the
// error's first words.
func Check(doing string) error {
	return check(doing, os.Geteuid(), capsIn("/proc/self/status"))
}

// check is Check for a process of euid whose effective capabilities are
// caps.
func check(doing string, euid int, caps uint64) error {
	switch {
	case euid != 0:
		return fmt.Errorf("%s: flmbox needs root (it runs runsc and mounts as root); this process runs as uid %d: %w", doing, euid, errdefs.ErrPermissionDenied)
	case caps&(1<<capSysAdmin) == 0:
		return fmt.Errorf("%s: flmbox needs root with CAP_SYS_ADMIN, which this process lacks: %w", doing, errdefs.ErrPermissionDenied)
	}
	return nil
}

// capsIn are the effective capabilities (CapEff) in status, a
// /proc/PID/status file; all of them if it cannot be read.
func capsIn(status string) uint64 {
	b, err := os.ReadFile(status)
	if err != nil {
		return ^uint64(0)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			if caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil {
				return caps
			}
		}
	}
	return ^uint64(0)
}
