package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/privilege"
	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox/record"
)

// ErrCheckpointDamaged is in the error of a resume whose checkpoint image
// runsc cannot restore (a panic of gVisor's restore, a truncated or garbled
// file): the sandbox stays suspended, and no resume will bring it back; it
// can only be removed. It is errdefs.ErrDataLoss.
var ErrCheckpointDamaged = errkind.New(errdefs.ErrDataLoss, "its checkpoint is damaged")

// checkPrivileges fails, with errdefs.ErrPermissionDenied and before
// anything is made, unless this process can make sandboxes: runsc (as
// flmbox runs it) and the run directory's tmpfs need root, with
// CAP_SYS_ADMIN (privilege.Check, the flmbox command's check too).
func checkPrivileges(doing string) error { return privilege.Check(doing) }

// createDoing is what making a sandbox named name (maybe "") is called in
// an error.
func createDoing(name string) string {
	if name == "" {
		return "create a sandbox"
	}
	return fmt.Sprintf("create sandbox %q", name)
}

// failure is an error as a person reads it: one line, what failed and
// where the rest is; its chain holds the whole of it (runsc's words, the
// kinds, the context's end) for errors.Is and errors.As.
type failure struct {
	msg  string
	errs []error
}

func (f *failure) Error() string   { return f.msg }
func (f *failure) Unwrap() []error { return f.errs }

// runscFailed is the error of runsc's failure err to do what doing says:
// runsc's first line (its panics, urpc messages and stack traces stay in
// the log at logPath, where the whole of err is added, and go to the debug
// log; the message names the log as shown), ctx's end if it ended,
// ErrCheckpointDamaged if a restore could not read its image,
// errdefs.ErrResourceExhausted if a disk is full.
func (m *Manager) runscFailed(ctx context.Context, doing, logPath, shown string, err error) error {
	m.o.debugf("%s: %v", doing, err)
	appendLog(logPath, doing, err)
	logPath = shown
	f := &failure{errs: []error{err}}
	switch {
	case ctx.Err() != nil:
		cause := context.Cause(ctx)
		f.msg = fmt.Sprintf("%s: %v (runsc's log: %s)", doing, cause, logPath)
		f.errs = append(f.errs, ctx.Err(), cause)
	case strings.HasPrefix(doing, "restore") && damaged(err):
		f.msg = fmt.Sprintf("%s: %v (%s; runsc's log: %s): %v", doing, ErrCheckpointDamaged, firstLine(runscWords(err)), logPath, errdefs.ErrDataLoss)
		f.errs = append(f.errs, ErrCheckpointDamaged)
	default:
		f.msg = fmt.Sprintf("%s: %s (runsc's log: %s)", doing, firstLine(runscLine(err)), logPath)
	}
	if full(err) {
		f.msg += ": " + errdefs.ErrResourceExhausted.Error()
		f.errs = append(f.errs, errdefs.ErrResourceExhausted)
	}
	return f
}

// damaged says whether a restore's failure is of its image: gVisor panics
// reading it, or its restore RPC fails (a truncated or garbled file).
func damaged(err error) bool {
	s := err.Error()
	return strings.Contains(s, "panic: ") || restoreRPC.MatchString(s)
}

// restoreRPC is runsc's words when the sandbox's restore fails: `urpc
// method "containerManager.Restore" failed: EOF`.
var restoreRPC = regexp.MustCompile(`urpc[^\n]*Restore[^\n]*failed[^\n]*`)

// runscWords is what runsc said in err: its panic line, else its failed
// restore RPC, else its text after the exit status.
func runscWords(err error) string {
	s := err.Error()
	if i := strings.Index(s, "panic: "); i >= 0 {
		return s[i:]
	}
	if w := restoreRPC.FindString(s); w != "" {
		if i := strings.Index(w, "urpc"); i >= 0 {
			return w[i:]
		}
	}
	if i := strings.Index(s, "exit status "); i >= 0 {
		if j := strings.Index(s[i:], ": "); j >= 0 {
			return s[i+j+2:]
		}
	}
	return s
}

// runscLine is the line of err worth a person's reading: runsc's panic
// line if it panicked, else the first line.
func runscLine(err error) string {
	s := err.Error()
	if i := strings.Index(s, "panic: "); i >= 0 {
		prefix := firstLine(s[:i])
		if j := strings.Index(s, ": exit status "); j >= 0 && j < i {
			if k := strings.Index(s[j+2:], ": "); k >= 0 {
				prefix = s[:j+2+k]
			}
		}
		return prefix + ": " + firstLine(s[i:])
	}
	return s
}

// firstLine is s's first non-empty line, at most about 200 bytes: a
// longer one is cut after a word (shorten).
func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return shorten(l, 200)
		}
	}
	return s
}

// shorten cuts s to at most n bytes and an ellipsis, after its last whole
// word within them (never inside a word or a character, unless one word
// fills the first half).
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if i := strings.LastIndexAny(s[:cut], " \t"); i >= n/2 {
		cut = i
	}
	return strings.TrimRight(s[:cut], " \t,:;") + " …"
}

// full says whether err is of a full disk or quota.
func full(err error) bool {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "no space left on device") || strings.Contains(s, "disk quota exceeded")
}

// exhausted adds errdefs.ErrResourceExhausted to an error of a full disk or
// quota, and ctx's end to an error of an operation that ctx ended, so that
// errors.Is finds both whatever the code below said.
func exhausted(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if full(err) && !errdefs.IsResourceExhausted(err) {
		err = fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = &failure{msg: fmt.Sprintf("%v (%v)", err, context.Cause(ctx)), errs: []error{err, ctx.Err(), context.Cause(ctx)}}
	}
	return err
}

// appendLog keeps the whole of err in the log at path, after what runsc
// wrote there.
func appendLog(path, doing string, err error) {
	f, ferr := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if ferr != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "flmbox %s: %s: %v\n", time.Now().UTC().Format(time.RFC3339), doing, err)
}

// createLog is where a failed Create keeps runsc's log of the sandbox of
// rec, whose directory it removes: ROOT/logs/NAME.create.log.
func (m *Manager) createLog(rec *record.Record) string {
	return filepath.Join(stateroot.Logs(m.root), rec.Name+".create.log")
}

// keepCreateLog copies the console log of the sandbox of rec, which a
// failed Create removes, to createLog, and returns that path.
func (m *Manager) keepCreateLog(rec *record.Record) string {
	p := m.createLog(rec)
	if err := os.MkdirAll(stateroot.Logs(m.root), 0o700); err != nil {
		return consolePath(rec)
	}
	b, _ := os.ReadFile(consolePath(rec))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return consolePath(rec)
	}
	return p
}
