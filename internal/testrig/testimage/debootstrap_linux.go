package testimage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/mountinfo"
)

// debootstrapPath is where Debian installs debootstrap; PATH is searched
// first.
const debootstrapPath = "/usr/sbin/debootstrap"

// runDebootstrap builds r into target. debootstrap runs in its own process
// group and mount namespace, so the /proc and /sys it mounts inside target
// vanish with it even when it is killed; on cancellation the group gets
// SIGTERM, then the leader SIGKILL after 30 s. The error carries the tail of
// its output.
func runDebootstrap(ctx context.Context, r recipe, target string) error {
	bin, err := exec.LookPath("debootstrap")
	if err != nil {
		bin = debootstrapPath
		if _, serr := os.Stat(bin); serr != nil {
			return fmt.Errorf("find debootstrap: install it with 'apt-get install debootstrap': %w", errors.Join(err, errdefs.ErrNotFound))
		}
	}
	tail := &tailBuffer{max: 8 << 10}
	cmd := exec.CommandContext(ctx, bin, r.debootstrapArgs(target)...)
	cmd.Env = append(os.Environ(),
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdout, cmd.Stderr = tail, tail
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = errors.Join(ctxErr, err)
		}
		return fmt.Errorf("run debootstrap %s: %w\ncheck that the mirror is reachable and the cache directory has 500 MB free; debootstrap's output ends with:\n%s",
			strings.Join(cmd.Args[1:], " "), err, tail.lines(30))
	}
	return nil
}

// tailBuffer keeps the last bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

// lines returns the last n lines.
func (t *tailBuffer) lines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ls := strings.Split(strings.TrimRight(string(t.buf), "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// cleanStats tells what cleanTree removed.
type cleanStats struct {
	Removed int      // top-level entries removed
	Special []string // device nodes, sockets and fifos among them (and below)
}

// cleanTree empties dev, proc, sys and run (keeping the directories) and
// drops downloaded packages and apt lists from the tree at root.
func cleanTree(root string) (cleanStats, error) {
	var st cleanStats
	var victims []string
	for _, d := range []string{"dev", "proc", "sys", "run", "var/lib/apt/lists"} {
		ents, err := os.ReadDir(filepath.Join(root, d))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return st, fmt.Errorf("clean tree: %w", err)
		}
		for _, e := range ents {
			victims = append(victims, filepath.Join(root, d, e.Name()))
		}
	}
	debs, err := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	if err != nil {
		return st, fmt.Errorf("clean tree: %w", err)
	}
	victims = append(victims, debs...)
	if err := refuseMounts(root); err != nil {
		return st, err
	}
	for _, v := range victims {
		filepath.WalkDir(v, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket|fs.ModeNamedPipe) != 0 {
				rel, _ := filepath.Rel(root, p)
				st.Special = append(st.Special, rel)
			}
			return nil
		})
		if err := os.RemoveAll(v); err != nil {
			return st, fmt.Errorf("clean tree: %w", err)
		}
		st.Removed++
	}
	return st, nil
}

// refuseMounts fails when something is mounted below dir: removing the
// tree would then delete files outside it (a bind-mounted /dev).
func refuseMounts(dir string) error {
	mps, err := mountinfo.Under(dir)
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("refuse to remove %s: %s still mounted below it; unmount them (umount -R) and retry: %w",
			dir, strings.Join(mps, ", "), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// removeTree removes a build directory unless something is mounted in it.
func removeTree(dir string) error {
	if err := refuseMounts(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}
