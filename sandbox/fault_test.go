package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/flmbox/flmbox/internal/mountinfo"
	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox/record"
)

// panicLog is what runsc says when gVisor's restore panics on a damaged
// image: a panic line, then a goroutine dump.
const panicLog = `I0101 00:00:00.000000 1 restore.go:10] Restoring
panic: unable to load state: decoding object: unexpected EOF [recovered]

goroutine 1 [running]:
gvisor.dev/gvisor/pkg/state.(*decodeState).Load(...)
	pkg/state/decode.go:123 +0x1
gvisor.dev/gvisor/runsc/boot.(*restorer).restore(...)
	runsc/boot/restore.go:200 +0x2
`

// urpcLog is what runsc says of a truncated pages file.
const urpcLog = `W0101 00:00:00.000000 1 util.go:64] FATAL ERROR: restoring container: urpc method "containerManager.Restore" failed: EOF
urpc method "containerManager.Restore" failed: EOF
`

// fakeRunsc writes a runsc that does what script says for the command
// named cmd (run, restore, checkpoint) and succeeds at everything else
// without a word, for the error paths of Create, Resume and Suspend
// without gVisor.
func fakeRunsc(t *testing.T, cmd, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	body := "#!/bin/sh\nfor a; do [ \"$a\" = " + cmd + " ] && { " + script + "\n}; done\nexit 0\n"
	testprog.Write(t, p, []byte(body))
	return p
}

// testLayout writes an OCI layout of a small linux/amd64 image and
// returns its reference.
func testLayout(t *testing.T) string {
	t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return "oci-layout:" + dir + "@" + d.String()
}

// checkRootClean fails t if the state root holds anything of a sandbox: a
// directory under sandboxes/, an image lease, a mount.
func checkRootClean(t *testing.T, m *Manager) {
	t.Helper()
	ents, _ := os.ReadDir(stateroot.Sandboxes(m.Root()))
	for _, e := range ents {
		t.Errorf("left in sandboxes/: %s", e.Name())
	}
	if store, err := m.Images(); err == nil {
		leases, err := store.Leases()
		if err != nil || len(leases) > 0 {
			t.Errorf("image leases left: %+v, %v", leases, err)
		}
	}
	if mounts, err := mountinfo.Under(m.Root()); err != nil || len(mounts) > 0 {
		t.Errorf("mounts left under the state root: %q, %v", mounts, err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("makes a sandbox's run directory (a tmpfs): needs root")
	}
}

// agentForTests is any executable file: the fake runsc never runs it.
func agentForTests(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), AgentName)
	testprog.Write(t, p, []byte("#!/bin/sh\n"))
	return p
}

// TestCreateFailuresLeaveNothing walks Create's failures (a missing image,
// a refused spec, runsc failing with a panic, a ctx that ends while runsc
// runs) and checks that each leaves no record, lease or mount, says one
// line, keeps its kind and ctx's end in its chain, and keeps runsc's words
// in the log it names.
func TestCreateFailuresLeaveNothing(t *testing.T) {
	needRoot(t)
	image := testLayout(t)
	for _, tc := range []struct {
		name    string
		runsc   string // the fake's script for runsc run
		spec    Spec
		timeout time.Duration
		is      []error
		log     string // in the log the message names
	}{
		{name: "missing layout", spec: Spec{Image: "oci-layout:/no/such/layout"}, is: []error{errdefs.ErrNotFound}},
		{name: "mount of the state root", spec: Spec{Image: image, Mounts: []Mount{{Source: "ROOT", Destination: "/x"}}}, is: []error{errdefs.ErrInvalidArgument}},
		{name: "runsc panics", runsc: "printf '%s' '" + panicLog + "' >&2; exit 2", spec: Spec{Image: image}, log: "goroutine 1 [running]"},
		{name: "ctx ends in runsc", runsc: "exec sleep 20", spec: Spec{Image: image}, timeout: 500 * time.Millisecond,
			is: []error{context.DeadlineExceeded}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			runsc := fakeRunsc(t, "run", tc.runsc)
			var debug []string
			m, err := Open(root, WithRunsc(runsc), WithAgent(agentForTests(t)),
				WithDebugf(func(f string, a ...any) { debug = append(debug, f) }))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			spec := tc.spec
			spec.Name = "sb"
			for i := range spec.Mounts {
				spec.Mounts[i].Source = strings.ReplaceAll(spec.Mounts[i].Source, "ROOT", root)
			}
			start := time.Now()
			_, err = m.Create(ctx, spec)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("Create took %s", d)
			}
			t.Logf("error: %v", err)
			for _, kind := range tc.is {
				if !errors.Is(err, kind) {
					t.Errorf("error %q is not %v", err, kind)
				}
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "goroutine") {
				t.Errorf("error %q: want one line, without runsc's stack trace", err)
			}
			if tc.log != "" {
				p := filepath.Join(stateroot.Logs(root), "sb.create.log")
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error %q does not name the log %s", err, p)
				}
				if b, err := os.ReadFile(p); err != nil || !strings.Contains(string(b), tc.log) {
					t.Errorf("log %s: %v, want %q in %q", p, err, tc.log, b)
				}
				if len(debug) == 0 {
					t.Errorf("nothing went to the debug log")
				}
			}
			checkRootClean(t, m)
		})
	}
}

// suspendedSandbox writes the record, bundle and checkpoint image of a
// suspended sandbox.
func suspendedSandbox(t *testing.T, root string, state record.State) string {
	t.Helper()
	dir := writeRecord(t, root, record.Record{Name: "sus", ID: runtime.NewID(), Network: "none", State: state})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"ociVersion":"1.0.0"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, checkpointDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, checkpointDir, "checkpoint.img"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func recordState(t *testing.T, root, name string) record.State {
	t.Helper()
	rec, err := record.Read(root, name)
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

// TestFailedResumeLeavesItSuspended: a resume without runsc, or of an image
// runsc cannot restore, fails saying so in one line and leaves the sandbox
// recorded suspended when it returns; a resume that a failed or killed
// flmbox left (resuming, its lock free) is ended by the next Resume or
// Call, not by some later sandbox ls.
func TestFailedResumeLeavesItSuspended(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name    string
		runsc   string // "": none
		state   record.State
		damaged bool
	}{
		{name: "runsc gone", state: record.Suspended},
		{name: "runsc gone, left resuming", state: record.Resuming},
		{name: "panic", runsc: "printf '%s' '" + panicLog + "' >&2; exit 2", state: record.Suspended, damaged: true},
		{name: "urpc", runsc: "printf '%s' '" + urpcLog + "' >&2; exit 128", state: record.Suspended, damaged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			runsc := "/no/such/runsc"
			if tc.runsc != "" {
				runsc = fakeRunsc(t, "restore", tc.runsc)
			}
			m, err := Open(root, WithRunsc(runsc), WithAgent(agentForTests(t)))
			if err != nil {
				t.Fatal(err)
			}
			dir := suspendedSandbox(t, root, tc.state)
			_, err = m.Resume(context.Background(), "sus")
			if err == nil {
				t.Fatal("Resume succeeded")
			}
			t.Logf("error: %v", err)
			if got := recordState(t, root, "sus"); got != record.Suspended {
				t.Errorf("after a failed resume the record says %s, want suspended", got)
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "goroutine") {
				t.Errorf("error %q: want one line, without runsc's stack trace", err)
			}
			if tc.damaged {
				if !errors.Is(err, ErrCheckpointDamaged) || !errdefs.IsDataLoss(err) {
					t.Errorf("error %q: want ErrCheckpointDamaged, data loss", err)
				}
				log := filepath.Join(dir, "console.log")
				if !strings.Contains(err.Error(), `restore sandbox "sus": its checkpoint is damaged (`) || !strings.Contains(err.Error(), log) {
					t.Errorf("error %q: want what is damaged and the log %s", err, log)
				}
			}
			if mounts, _ := mountinfo.Under(root); len(mounts) > 0 {
				t.Errorf("mounts left: %q", mounts)
			}
			if _, err := os.Stat(filepath.Join(dir, checkpointDir, "checkpoint.img")); err != nil {
				t.Errorf("the image is not kept: %v", err)
			}
			// A call says suspended (to resume), not resuming (to wait).
			suspendedSandbox(t, root, tc.state)
			if _, err := m.Call(context.Background(), "sus", Request{Code: "1"}); !errors.Is(err, ErrSuspended) {
				t.Errorf("call: %v, want ErrSuspended", err)
			}
			if got := recordState(t, root, "sus"); got != record.Suspended {
				t.Errorf("after a call the record says %s, want suspended", got)
			}
		})
	}
}

// TestFailedSuspendLeavesItRunning: a suspend whose runsc is gone fails
// and leaves the record running.
func TestFailedSuspendLeavesItRunning(t *testing.T) {
	root := t.TempDir()
	m, err := Open(root, WithRunsc("/no/such/runsc"))
	if err != nil {
		t.Fatal(err)
	}
	writeRecord(t, root, record.Record{Name: "r", ID: runtime.NewID(), Network: "none", State: record.Running})
	if err := m.Suspend(context.Background(), "r"); err == nil {
		t.Fatal("Suspend succeeded")
	}
	if got := recordState(t, root, "r"); got != record.Running {
		t.Errorf("after a failed suspend the record says %s, want running", got)
	}
}

// TestSpecRefusesWhatCannotBeMet: limits the host cannot meet and mounts
// that hand a sandbox the host are refused by the one validation of a Spec,
// in one line naming the field.
func TestSpecRefusesWhatCannotBeMet(t *testing.T) {
	root := t.TempDir()
	link := filepath.Join(t.TempDir(), "slash")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	for _, tc := range []struct {
		name string
		spec Spec
		want string // "": accepted
	}{
		{"cpus above the host's", Spec{Limits: Limits{CPUs: 1000}}, "cpus 1000 is more than this host's"},
		{"/tmp above memory", Spec{TmpBytes: 100 << 40}, "/tmp size 109951162777600 bytes is more than the memory limit"},
		{"/tmp as memory", Spec{TmpBytes: DefaultLimits.MemoryBytes}, ""},
		{"the host's root", Spec{Mounts: []Mount{{Source: "/", Destination: "/h", ReadWrite: true}}}, "mount 0: source /: the host's root"},
		{"a link to it", Spec{Mounts: []Mount{{Source: link, Destination: "/h"}}}, "the host's root"},
		{"/proc", Spec{Mounts: []Mount{{Source: "/proc", Destination: "/h"}}}, "/proc is not for sandboxes"},
		{"under /proc", Spec{Mounts: []Mount{{Source: "/proc/1/root", Destination: "/h"}}}, "/proc is not for sandboxes"},
		{"/sys", Spec{Mounts: []Mount{{Source: "/sys/", Destination: "/h"}}}, "/sys is not for sandboxes"},
		{"/dev", Spec{Mounts: []Mount{{Source: "/dev", Destination: "/h"}}}, "/dev is not for sandboxes"},
		{"the state root", Spec{Mounts: []Mount{{Source: root, Destination: "/h"}}}, "inside flmbox's state root"},
		{"inside it", Spec{Mounts: []Mount{{Source: root + "/images", Destination: "/h"}}}, "inside flmbox's state root"},
		{"above it", Spec{Mounts: []Mount{{Source: filepath.Dir(root), Destination: "/h"}}}, "it holds flmbox's state root"},
		{"relative", Spec{Mounts: []Mount{{Source: "data", Destination: "/h"}}}, "want an absolute host path"},
		{"a directory", Spec{Mounts: []Mount{{Source: data, Destination: "/h"}, {Source: data, Destination: "/w", ReadWrite: true}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.Image = "img"
			_, err := spec.withDefaults(root)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n")):
				t.Errorf("%v, want one line with %q, invalid argument", err, tc.want)
			}
		})
	}
	// Mounts are read-only unless marked: the bundle says so.
	if ro := (Mount{}).ReadWrite; ro {
		t.Error("a Mount is read-write by default")
	}
}

// TestGetAndListRunNothing: Get and List read records (no runsc, no ping:
// a hung runsc delays nothing), and Probe checks each running sandbox within
// ProbeTimeout, all at once, so one that hangs neither delays nor mislabels
// another.
func TestGetAndListRunNothing(t *testing.T) {
	root, marks := t.TempDir(), t.TempDir()
	// runsc state hangs on every sandbox, once it has seen three of
	// itself alive at once (a mark each, named by its pid, then
	// "together").
	runsc := fakeRunsc(t, "state", "touch "+marks+"/started.$$; while :; do n=0; for f in "+marks+"/started.*; do "+
		"kill -0 ${f##*.} 2>/dev/null && n=$((n+1)); done; [ $n -ge 3 ] && break; sleep 0.01; done; touch "+marks+"/together; exec sleep 60")
	m, err := Open(root, WithRunsc(runsc))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		writeRecord(t, root, record.Record{Name: name, ID: runtime.NewID(), Network: "none", State: record.Running})
	}
	ctx := context.Background()
	sb, err := m.Get(ctx, "a")
	if err != nil || sb.State != StateRunning {
		t.Fatalf("Get: %+v, %v", sb, err)
	}
	sbs, err := m.List(ctx)
	if err != nil || len(sbs) != 3 {
		t.Fatalf("List: %v, %v", sbs, err)
	}
	if ents, _ := os.ReadDir(marks); len(ents) != 0 {
		t.Errorf("Get and List ran runsc (%d marks)", len(ents))
	}
	probed := m.Probe(ctx, sbs...)
	if _, err := os.Stat(filepath.Join(marks, "together")); err != nil {
		t.Errorf("Probe did not ask runsc of the 3 sandboxes at once: %v", err)
	}
	for i, sb := range probed {
		if sb.State != StateUnresponsive {
			t.Errorf("%s: %s, want unresponsive (not known dead: runsc did not answer)", sb.Name, sb.State)
		}
		if sbs[i].State != StateRunning {
			t.Errorf("Probe changed the caller's %s: %s", sbs[i].Name, sbs[i].State)
		}
	}
}

func TestShortenCutsAfterAWord(t *testing.T) {
	long := `mount submount "/tmp": creating mount with source "tmpfs": ` + strings.Repeat("word ", 40)
	got := shorten(long, 80)
	if len(got) > 84 || !strings.HasSuffix(got, " …") || strings.HasSuffix(strings.TrimSuffix(got, " …"), "wor") {
		t.Errorf("shorten: %q", got)
	}
	if !strings.HasPrefix(long, strings.TrimSuffix(got, " …")) {
		t.Errorf("shorten changed the text: %q", got)
	}
	if got := shorten("short", 80); got != "short" {
		t.Errorf("shorten of a short text: %q", got)
	}
	if got := shorten(strings.Repeat("é", 100), 51); !utf8.ValidString(got) {
		t.Errorf("shorten cut a character: %q", got)
	}
}
