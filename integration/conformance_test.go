//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testimage"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox"
)

// The conformance suite (docs/CONFORMANCE.md): CPython's own regression
// tests, from the test image's variant with libpython3.11-testsuite, and
// numpy's and pandas' own tests and a data-science agent's workloads, from
// the variant with Debian's data-science stack
// (conformance_datascience_test.go), run under bare runsc with flmbox's
// spec and under flmbox run, compared per test. A test that passes under
// bare runsc and fails, errs, is skipped or does not run under flmbox, each
// time it is run again on both sides, is a difference; one not in the doc's
// table fails the test.

// conformanceEnv selects the list of modules: unset or "short", the list
// make test runs; "full", every module (make conformance); or a
// comma-separated list of module names (regrtest's, pytest's as dotted
// module names, or workloads).
const conformanceEnv = "FLMBOX_CONFORMANCE"

// conformanceOutEnv names a directory that keeps what each run printed
// (MODULE-N-bare.out, MODULE-N-flmbox.out: every test's outcome and the
// end of regrtest's or pytest's output), for a closer look.
const conformanceOutEnv = "FLMBOX_CONFORMANCE_OUT"

// conformanceDoc holds the table of known differences and the lists.
const conformanceDoc = "../docs/CONFORMANCE.md"

const (
	// conformanceReruns is how many times a difference is run again, on
	// both sides, before it counts: CPython's tests have timing-sensitive
	// cases, and the machine is busy.
	conformanceReruns = 2
	// moduleTimeout bounds one run of a module, unless the module says
	// otherwise: regrtest's --timeout, or faulthandler's for pytest and the
	// workloads (the stacks are dumped and the run exits; the outcomes so
	// far are kept). flmbox's --timeout and the test's own deadline are
	// above it. Five times the slowest module of the short list on a busy
	// machine.
	moduleTimeout = 4 * time.Minute
	// outcomeMarker starts the lines outcomes.py writes.
	outcomeMarker = "\x1eflmbox-conformance "
	// exitMarker starts the line with the exit status of regrtest, of
	// pytest, or of workloads.py (0): the run finished.
	exitMarker = "\x1eflmbox-conformance-exit "
)

// suite is what runs a module's tests.
type suite int

const (
	// regrtest is CPython's (python3 -m test), in the image's Testsuite
	// variant.
	regrtest suite = iota
	// pytest runs a test file of a library of the image's DataScience
	// variant.
	pytest
	// workloads is workloads.py, run as a Python snippet, in the image's
	// DataScience variant.
	workloads
)

// testModule is a module of tests: of CPython's, as regrtest names it; a
// test file of a library, as a dotted module name (numpy.core.tests.test_x),
// run by pytest; or the workloads. match selects part of it (nil: all of
// it): regrtest -m patterns, pytest -k expressions (one of them), or the
// names of workloads.
type testModule struct {
	name  string
	suite suite
	match []string
	// memory is both sides' --memory when flmbox's default is not enough
	// (0: the default).
	memory int64
	// timeout replaces moduleTimeout for a slow module.
	timeout time.Duration
}

// runTimeout is m's timeout.
func (m testModule) runTimeout() time.Duration { return cmp.Or(m.timeout, moduleTimeout) }

// image is the variant of the test image that m runs in.
func (m testModule) image() testimage.Options {
	if m.suite == regrtest {
		return testimage.Options{Testsuite: true}
	}
	return testimage.Options{DataScience: true}
}

// owns reports whether the test id is one of m's, or m's own name.
func (m testModule) owns(id string) bool {
	switch m.suite {
	case pytest:
		return id == m.name || id == m.pytestFile() || strings.HasPrefix(id, m.pytestFile()+"::")
	case workloads:
		return id == m.name || strings.HasPrefix(id, m.name+".")
	}
	return id == m.name || strings.HasPrefix(id, "test."+m.name+".")
}

// limits are m's limits on both sides: flmbox's defaults, and its memory.
func (m testModule) limits() sandbox.Limits {
	l := sandbox.DefaultLimits
	if m.memory > 0 {
		l.MemoryBytes = m.memory
	}
	return l
}

// conformanceFull is what make conformance runs: CPython's modules, then
// the data-science modules.
var conformanceFull = slices.Concat(regrFull, dataScienceFull)

// conformanceShort is what make test runs.
var conformanceShort = slices.Concat(regrShort, dataScienceShort)

// regrFull are the CPython modules of the full list.
var regrFull = []testModule{
	{name: "test_asyncio.test_subprocess"},
	{name: "test_atexit"},
	{name: "test_cmd_line"},
	{name: "test_concurrent_futures", timeout: 15 * time.Minute}, // 3 to 4 minutes a side
	{name: "test_faulthandler"},
	{name: "test_fcntl"},
	{name: "test_io"},
	{name: "test_locale"},
	{name: "test_mmap"},
	// Its Process, Queue, Pool and Lock classes, with processes, threads
	// and a manager (the whole module takes many minutes).
	{name: "test_multiprocessing_fork", match: []string{"With*TestProcess", "With*TestQueue", "With*TestPool", "With*TestLock"}, memory: multiprocessingMemory},
	{name: "test_os"},
	{name: "test_pathlib"},
	{name: "test_posix"},
	{name: "test_pty"},
	{name: "test_queue"},
	{name: "test_resource"},
	{name: "test_select"},
	{name: "test_selectors"},
	{name: "test_shutil"},
	{name: "test_signal"},
	{name: "test_site"},
	{name: "test_socket"},
	{name: "test_subprocess"},
	{name: "test_sys"},
	{name: "test_tarfile"},
	{name: "test_tempfile"},
	{name: "test_threading"},
	{name: "test_time"},
	{name: "test_zipfile"},
}

// multiprocessingMemory is both sides' --memory for
// test_multiprocessing_fork. Its run uses some 1.8 GiB at its peak, in
// test_many_processes (100 forked Pythons, some 5 MiB each under gVisor:
// docs/ARCHITECTURE.md, "The memory watch"; MemTotal - MemAvailable in the
// sandbox, every 200 ms). With flmbox's default (512 MiB) and with 1 GiB
// both sides were killed there; with 2 GiB flmbox killed it in 1 run of 3,
// as --memory says, where bare runsc's cgroup allows flmbox's headroom for
// gVisor on top (2.5 GiB). 3 GiB keeps the module away from the limit.
const multiprocessingMemory = 3 << 30

// regrShort are the CPython modules of the short list, about a minute: a
// module of each kind (processes, threads, signals, files, sockets, the
// interpreter's environment), among them every module where flmbox
// differed once (docs/CONFORMANCE.md); of the longer ones, the classes where
// it differed and a few of their kind.
var regrShort = []testModule{
	{name: "test_atexit"},
	// PYTHONUNBUFFERED reached the snippet's Pythons.
	{name: "test_cmd_line", match: []string{"*buffer*"}},
	{name: "test_fcntl"},
	// test_threads_write met RLIMIT_AS; the C implementation's classes
	// behave as the Python one's.
	{name: "test_io", match: []string{"CTextIOWrapperTest", "CIOTest"}},
	{name: "test_locale"},
	{name: "test_mmap"},
	// Of its Process class with processes, test_many_processes (which met
	// RLIMIT_NPROC) and a few of its kind.
	{name: "test_multiprocessing_fork", match: []string{"*WithProcessesTestProcess.test_many_processes", "*WithProcessesTestProcess.test_process",
		"*WithProcessesTestProcess.test_terminate", "*WithProcessesTestProcess.test_active_children", "*WithProcessesTestProcess.test_recursion"},
		memory: multiprocessingMemory},
	{name: "test_os", match: []string{"FileTests", "StatAttributeTests", "ForkTests", "PidTests", "TestScandir"}},
	{name: "test_pty"},
	// The six test_many_threads* met RLIMIT_AS.
	{name: "test_queue", match: []string{"*test_many_threads*"}},
	{name: "test_resource"},
	{name: "test_select"},
	{name: "test_site"},
	// "localhost" did not resolve without /etc/hosts.
	{name: "test_socket", match: []string{"GeneralModuleTests", "BasicTCPTest", "BasicUDPTest"}},
	{name: "test_tempfile"},
	// Threads met RLIMIT_AS.
	{name: "test_threading", match: []string{"ThreadTests", "*ThreadJoinOnShutdown.test_4_daemon_threads"}},
	{name: "test_time"},
}

// regrName is the name of a module of CPython's tests.
var regrName = regexp.MustCompile(`^test_[a-z0-9_]+(\.test_[a-z0-9_]+)?$`)

// conformanceModules is the list conformanceEnv selects.
func conformanceModules(t *testing.T) []testModule {
	switch v := os.Getenv(conformanceEnv); v {
	case "", "short":
		return conformanceShort
	case "full":
		return conformanceFull
	default:
		// Modules of the full list as it runs them, others whole.
		var out []testModule
		for _, name := range strings.Split(v, ",") {
			m := testModule{name: name}
			switch i := slices.IndexFunc(conformanceFull, func(f testModule) bool { return f.name == name }); {
			case i >= 0:
				m = conformanceFull[i]
			case regrName.MatchString(name):
			case pytestName.MatchString(name):
				m.suite = pytest
			default:
				t.Fatalf("%s=%q: want short, full or module names separated by commas (regrtest's, as test_os; pytest's, as numpy.core.tests.test_umath; or workloads)", conformanceEnv, v)
			}
			out = append(out, m)
		}
		return out
	}
}

func TestConformance(t *testing.T) {
	// Not parallel: CPython's timing-sensitive tests compare two sides that must share a quiet machine.
	known := readKnownDifferences(t)
	modules := conformanceModules(t)
	sides := map[testimage.Options]*conformance{} // by variant, made when first needed
	// Every variant is prewarmed from the start, each into a root of its
	// own: the first variant's at once, the others' with the CPU time the
	// first variant's modules leave (nice).
	roots := map[testimage.Options]*variantRoot{}
	for _, m := range modules {
		if roots[m.image()] == nil {
			roots[m.image()] = prewarmVariant(m.image(), t.TempDir(), len(roots) > 0)
		}
	}
	defer func() {
		for _, r := range roots {
			<-r.done
		}
	}()

	var failed []string
	var timings []string
	for _, m := range modules {
		c := sides[m.image()]
		if c == nil {
			c = newConformance(t, m.image(), roots[m.image()])
			sides[m.image()] = c
		}
		start := time.Now()
		r := c.compare(t, m, known)
		timings = append(timings, fmt.Sprintf("%-30s bare runsc %6.1fs  flmbox %6.1fs  (%d reruns, %.0fs in all)",
			m.name, r.bareTook.Seconds(), r.flmboxTook.Seconds(), r.reruns, time.Since(start).Seconds()))
		for _, d := range r.differences {
			if k, ok := known[d.id]; ok {
				t.Logf("%s: known difference (%s; %s): bare runsc %s, flmbox %s", d.id, k.limit, k.flag, d.bare, d.flmbox)
				continue
			}
			failed = append(failed, d.String())
		}
		for _, id := range r.seen {
			if k, ok := known[id]; ok && !r.differedFirst[id] {
				t.Errorf("%s is in %s's table (%s) but no longer differs: remove its row", id, conformanceDoc, k.limit)
			}
		}
	}
	t.Logf("timings:\n%s", strings.Join(timings, "\n"))
	if len(failed) > 0 {
		t.Errorf("%d tests pass under bare runsc and not under flmbox, each time they ran, and are not in %s's table:\n%s",
			len(failed), conformanceDoc, strings.Join(failed, "\n"))
	}
}

// conformance runs modules on both sides, in one variant of the test image.
type conformance struct {
	bare    *bareRunsc
	flmbox  *flmboxRun
	scripts map[suite]string // what runs a module's tests, by suite
	runs    int              // runBoth calls, numbering the files of conformanceOutEnv
}

// conformanceScripts are the Python programs that run each suite's tests,
// under testdata/conformance.
var conformanceScripts = map[suite]string{regrtest: "outcomes.py", pytest: "pytest_outcomes.py", workloads: "workloads.py"}

// variantRoot is a state root that a variant of the test image is being
// prewarmed into; done is closed when it is (err says how it went).
type variantRoot struct {
	root    string
	variant *testimage.Image
	done    chan struct{}
	err     error
}

// prewarmVariant builds the variant of the test image that opts select
// (once per machine, then cached) and prewarms it into root, in the
// background (niced: niceCommand).
func prewarmVariant(opts testimage.Options, root string, niced bool) *variantRoot {
	r := &variantRoot{root: root, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		opts.Log = os.Stderr
		if r.variant, r.err = testimage.Build(ctx, opts); r.err != nil {
			r.err = fmt.Errorf("build the test image's variant %+v: %w", opts, r.err)
			return
		}
		out, err := niceCommand(ctx, niced, flmboxBin, "--root", root, "--runsc", runscPath, "prewarm", "--platform", "linux/amd64",
			fmt.Sprintf("oci-layout:%s@%s", r.variant.LayoutPath, r.variant.IndexDigest)).CombinedOutput()
		if err != nil {
			r.err = fmt.Errorf("prewarm the test image's variant %+v: %w\n%s", opts, err, out)
		}
	}()
	return r
}

// niceCommand is exec.CommandContext, run by nice -n 19 if niced:
// background work that takes the CPU time the tests leave rather than slow
// them.
func niceCommand(ctx context.Context, niced bool, name string, args ...string) *exec.Cmd {
	if niced {
		name, args = "nice", append([]string{"-n", "19", name}, args...)
	}
	return exec.CommandContext(ctx, name, args...)
}

// newConformance prepares both sides on the variant of the test image
// that vr was prewarmed with.
func newConformance(t *testing.T, opts testimage.Options, vr *variantRoot) *conformance {
	scripts := map[suite]string{}
	for s, name := range conformanceScripts {
		b, err := os.ReadFile(filepath.Join("testdata/conformance", name))
		if err != nil {
			t.Fatal(err)
		}
		scripts[s] = string(b)
	}
	<-vr.done
	if vr.err != nil {
		t.Fatal(vr.err)
	}
	root, variant := vr.root, vr.variant
	ref := fmt.Sprintf("oci-layout:%s@%s", variant.LayoutPath, variant.IndexDigest)
	res := prewarmJSON(t, root, "--platform", "linux/amd64", ref)
	if !res.Cached {
		t.Fatalf("the variant %+v prewarmed again: %+v", opts, res)
	}
	t.Cleanup(func() {
		out := flmbox(t, root, "sandbox", "ls", "--json")
		var sbs []struct{ Name string }
		json.Unmarshal([]byte(out.stdout), &sbs)
		for _, sb := range sbs {
			flmbox(t, root, "sandbox", "rm", sb.Name)
		}
		unix.Unmount(filepath.Join(stateroot.Runsc(root), "null-netns"), unix.MNT_DETACH)
	})

	amd64, err := variant.Index.Image(variant.AMD64Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := amd64.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return &conformance{
		bare:    newBareRunsc(t, res.Rootfs, cfg.Config.Env),
		flmbox:  &flmboxRun{root: root, ref: ref},
		scripts: scripts,
	}
}

// outcome is a test's result as outcomes.py records it; or unfinished:
// the test started and the run ended before its result (a crash, a kill, a
// timeout); or missing: the test did not start.
type outcome string

const (
	passed     outcome = "passed"
	failed     outcome = "failed"
	errored    outcome = "error"
	skipped    outcome = "skipped"
	xfail      outcome = "xfail"
	xpass      outcome = "xpass"
	unfinished outcome = "unfinished"
	missing    outcome = "missing"
)

// ok reports whether the test passed.
func (o outcome) ok() bool { return o == passed || o == xfail }

// rank orders the outcomes of one test recorded more than once (start,
// subtests, result): the worst wins.
func (o outcome) rank() int {
	return slices.Index([]outcome{unfinished, skipped, xfail, passed, xpass, failed, errored}, o)
}

// testResult is a test's outcome and what regrtest (or pytest, or a
// workload) said about it.
type testResult struct {
	outcome outcome
	detail  string
}

// moduleRun is one run of a module on one side. Its module's own name is a
// test too: passed if the run finished (whatever regrtest's or pytest's exit
// status), unfinished if not: killed, or ended by the run's timeout during
// a test.
type moduleRun struct {
	module   string
	tests    map[string]testResult
	finished bool
	exit     string // regrtest's or pytest's exit status
	tail     string // the end of regrtest's or pytest's output
	took     time.Duration
	err      error // running the script failed: runsc or flmbox said why
}

func (r *moduleRun) get(id string) testResult {
	if id == r.module {
		if r.finished {
			return testResult{outcome: passed}
		}
		var during []string
		for id, res := range r.tests {
			if res.outcome == unfinished {
				during = append(during, id)
			}
		}
		return testResult{outcome: unfinished, detail: fmt.Sprintf("the run ended during %s: %v", cmp.Or(strings.Join(during, ", "), "no test"), r.err)}
	}
	if res, ok := r.tests[id]; ok {
		return res
	}
	// unittest records a class's or module's fixture only when it fails or
	// skips: one whose tests ran passed.
	if _, scope, ok := strings.Cut(id, " ("); ok {
		scope = strings.TrimSuffix(scope, ")") + "."
		for t := range r.tests {
			if strings.HasPrefix(t, scope) {
				return testResult{outcome: passed}
			}
		}
	}
	return testResult{outcome: missing}
}

func (r *moduleRun) summary() string {
	n := map[outcome]int{}
	for _, res := range r.tests {
		n[res.outcome]++
	}
	var parts []string
	for _, o := range []outcome{passed, failed, errored, skipped, xfail, xpass, unfinished} {
		if n[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[o], o))
		}
	}
	s := fmt.Sprintf("%d tests (%s), exit %s, %.1fs", len(r.tests), strings.Join(parts, ", "), cmp.Or(r.exit, "none"), r.took.Seconds())
	if r.err != nil {
		s += fmt.Sprintf(", failed: %v", r.err)
	}
	return s
}

// parseOutcomes reads what regrScript printed when run for module.
func parseOutcomes(module, out string) *moduleRun {
	r := &moduleRun{module: module, tests: map[string]testResult{}}
	var tail []string
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, exitMarker); i >= 0 {
			r.exit, r.finished = strings.TrimSpace(line[i+len(exitMarker):]), true
			continue
		}
		i := strings.Index(line, outcomeMarker)
		if i < 0 {
			tail = append(tail, line)
			continue
		}
		var rec struct{ ID, Outcome, Detail string }
		if err := json.Unmarshal([]byte(line[i+len(outcomeMarker):]), &rec); err != nil || rec.ID == "" {
			tail = append(tail, line)
			continue
		}
		o := outcome(rec.Outcome)
		if o == "started" {
			o = unfinished
		}
		if prev, ok := r.tests[rec.ID]; ok && (prev.outcome != unfinished && prev.outcome.rank() >= o.rank() || o == unfinished) {
			continue
		}
		r.tests[rec.ID] = testResult{outcome: o, detail: rec.Detail}
	}
	r.tail = strings.Join(tail, "\n")
	// A test left unfinished: the run's timeout ended it, which still
	// printed its exit status.
	for _, res := range r.tests {
		if res.outcome == unfinished {
			r.finished = false
		}
	}
	return r
}

// fixtureFailed reports whether a test of id did not run because a
// fixture of its class or module did not pass: unittest then runs none of
// their tests, and records the fixture's outcome alone.
func (r *moduleRun) fixtureFailed(id string) bool {
	for i := len(id) - 1; i > 0; i-- {
		if id[i] != '.' {
			continue
		}
		for _, f := range []string{"setUpClass", "setUpModule"} {
			if res, ok := r.tests[f+" ("+id[:i]+")"]; ok && !res.outcome.ok() {
				return true
			}
		}
	}
	return false
}

// differences are the tests of m that passed under bare runsc and not under
// flmbox in one pair of runs, m's own name included (when flmbox's run did
// not finish and bare runsc's did); the tests that did not run because
// flmbox's run ended early, or because their class's fixture failed, are
// that one difference, not more.
func differences(m testModule, bare, flm *moduleRun) []string {
	ids := map[string]bool{m.name: true}
	for _, r := range []*moduleRun{bare, flm} {
		for id := range r.tests {
			ids[id] = true
		}
	}
	var out []string
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		b, f := bare.get(id), flm.get(id)
		switch {
		case !b.outcome.ok() || f.outcome.ok():
		case id != m.name && !flm.finished && (f.outcome == missing || f.outcome == unfinished):
		case f.outcome == missing && flm.fixtureFailed(id):
		default:
			out = append(out, id)
		}
	}
	return out
}

// snippet is a program in a language of flmbox run's: "shell" or "python".
type snippet struct{ language, code string }

// script is what both sides run for m, or only for the tests ids when there
// are some.
func (c *conformance) script(m testModule, ids []string) snippet {
	switch m.suite {
	case pytest:
		return snippet{"shell", c.pytestScript(m, ids)}
	case workloads:
		return snippet{"python", c.workloadsProgram(m, ids)}
	}
	return snippet{"shell", c.regrScript(m, ids)}
}

// regrScript is the shell script both sides run: outcomes.py and regrtest
// on m, or only on the tests ids when there are some.
func (c *conformance) regrScript(m testModule, ids []string) string {
	var b strings.Builder
	b.WriteString("cat > /tmp/flmbox-conformance.py <<'FLMBOX_EOF'\n" + c.scripts[regrtest] + "FLMBOX_EOF\n")
	args := []string{"--timeout", fmt.Sprint(int(m.runTimeout().Seconds()))}
	if patterns, whole := matchPatterns(ids); len(ids) > 0 && !whole && !slices.Contains(ids, m.name) {
		b.WriteString("cat > /tmp/flmbox-conformance.match <<'FLMBOX_EOF'\n" + strings.Join(patterns, "\n") + "\nFLMBOX_EOF\n")
		args = append(args, "--matchfile", "/tmp/flmbox-conformance.match")
	} else {
		for _, p := range m.match {
			args = append(args, "-m", shellQuote(p))
		}
	}
	args = append(args, m.name)
	// regrtest's own output goes to a file, printed after the outcomes.
	fmt.Fprintf(&b, "python3 /tmp/flmbox-conformance.py %s 3>&1 >/tmp/flmbox-conformance.log 2>&1\n", strings.Join(args, " "))
	fmt.Fprintf(&b, "printf '%%s%%s\\n' '%s' \"$?\"\n", exitMarker)
	b.WriteString("tail -n 40 /tmp/flmbox-conformance.log\n")
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// matchPatterns are the regrtest --matchfile patterns that run the tests
// ids: a test's id, escaped; for the fixture of a class, the class's tests.
// whole is true when one of them is a module's fixture: the whole module
// runs again.
func matchPatterns(ids []string) (patterns []string, whole bool) {
	escape := strings.NewReplacer("[", "[[]", "*", "[*]", "?", "[?]")
	for _, id := range ids {
		fixture, name, ok := strings.Cut(id, " (")
		switch {
		case !ok:
			patterns = append(patterns, escape.Replace(id))
		case fixture == "setUpClass" || fixture == "tearDownClass":
			patterns = append(patterns, escape.Replace(strings.TrimSuffix(name, ")"))+".*")
		default: // setUpModule, tearDownModule, or a name unittest made up
			return nil, true
		}
	}
	return patterns, false
}

// difference is a test that passed under bare runsc and not under flmbox,
// each time.
type difference struct {
	id           string
	bare, flmbox outcome
	detail       string
}

func (d difference) String() string {
	s := fmt.Sprintf("  %s: bare runsc %s, flmbox %s", d.id, d.bare, d.flmbox)
	if d.detail != "" {
		s += ": " + d.detail
	}
	return s
}

// comparison is what compare found for one module.
type comparison struct {
	differences          []difference
	seen                 []string        // every test id either side ran, and the module's
	differedFirst        map[string]bool // the tests that differed in the first run
	bareTook, flmboxTook time.Duration
	reruns               int
}

// compare runs m on both sides at once, then the tests that differ again,
// conformanceReruns times (all of m if flmbox's run did not finish), and
// keeps those that differed each time. A known difference is not run
// again: it differed, as its row says.
func (c *conformance) compare(t *testing.T, m testModule, known map[string]knownDifference) comparison {
	bare, flm := c.runBoth(t, m, nil)
	res := comparison{bareTook: bare.took, flmboxTook: flm.took, differedFirst: map[string]bool{}}
	t.Logf("%s: bare runsc: %s", m.name, bare.summary())
	t.Logf("%s: flmbox:     %s", m.name, flm.summary())
	if len(bare.tests) == 0 {
		t.Errorf("%s: bare runsc ran no test, so nothing can be compared: %v\n%s", m.name, bare.err, bare.tail)
		return res
	}
	for _, r := range []struct {
		side string
		run  *moduleRun
	}{{"bare runsc", bare}, {"flmbox", flm}} {
		if !r.run.finished || r.run.err != nil {
			t.Logf("%s: the run under %s did not finish: %s\n%s", m.name, r.side, r.run.get(m.name).detail, lastLines(r.run.tail, 20))
		}
	}
	ids := map[string]bool{m.name: true}
	for _, r := range []*moduleRun{bare, flm} {
		for id := range r.tests {
			ids[id] = true
		}
	}
	res.seen = slices.Sorted(maps.Keys(ids))
	if m.suite == workloads { // what each one took and measured, side by side
		for _, id := range res.seen {
			if b, f := bare.get(id), flm.get(id); id != m.name {
				t.Logf("%s: bare runsc %s (%s), flmbox %s (%s)", id, b.outcome, b.detail, f.outcome, f.detail)
			}
		}
	}
	var bothFail, onlyFlmbox []string
	for _, id := range res.seen {
		b, f := bare.get(id), flm.get(id)
		switch {
		case !b.outcome.ok() && b.outcome != skipped && !f.outcome.ok() && f.outcome != skipped:
			bothFail = append(bothFail, fmt.Sprintf("  %s: bare runsc %s (%s), flmbox %s", id, b.outcome, b.detail, f.outcome))
		case !b.outcome.ok() && f.outcome.ok():
			onlyFlmbox = append(onlyFlmbox, fmt.Sprintf("  %s: bare runsc %s (%s), flmbox %s", id, b.outcome, b.detail, f.outcome))
		}
	}
	if len(bothFail) > 0 {
		t.Logf("%s: %d tests fail on both sides (gVisor's, not flmbox's):\n%s", m.name, len(bothFail), strings.Join(bothFail, "\n"))
	}
	if len(onlyFlmbox) > 0 {
		t.Logf("%s: %d tests pass only under flmbox:\n%s", m.name, len(onlyFlmbox), strings.Join(onlyFlmbox, "\n"))
	}

	diff := differences(m, bare, flm)
	first := map[string]difference{}
	var expected []string
	for _, id := range diff {
		res.differedFirst[id] = true
		first[id] = difference{id: id, bare: bare.get(id).outcome, flmbox: flm.get(id).outcome, detail: flm.get(id).detail}
		t.Logf("%s: differs: %s", m.name, first[id])
		if _, ok := known[id]; ok {
			expected = append(expected, id)
		}
	}
	diff = slices.DeleteFunc(diff, func(id string) bool { return slices.Contains(expected, id) })
	for i := 0; i < conformanceReruns && len(diff) > 0; i++ {
		res.reruns++
		b2, f2 := c.runBoth(t, m, diff)
		var still []string
		for _, id := range diff {
			// Not passing under flmbox, whatever the reason: a test of a
			// run that flmbox ended early did not pass there either.
			b, f := b2.get(id), f2.get(id)
			if b.outcome.ok() && !f.outcome.ok() {
				still = append(still, id)
				continue
			}
			t.Logf("%s: differed, but not when run again (%d): bare runsc %s, flmbox %s %s", id, i+1, b.outcome, f.outcome, f.detail)
		}
		diff = still
	}
	for _, id := range append(expected, diff...) {
		res.differences = append(res.differences, first[id])
	}
	return res
}

// runBoth runs m (or only the tests ids) under bare runsc and under flmbox
// at once: the two sides share the machine's load.
func (c *conformance) runBoth(t *testing.T, m testModule, ids []string) (bare, flm *moduleRun) {
	script := c.script(m, ids)
	ctx, cancel := context.WithTimeout(context.Background(), m.runTimeout()+3*time.Minute)
	defer cancel()
	sides := []struct {
		name string
		run  func(context.Context, testModule, snippet) (string, error)
	}{{"bare", c.bare.run}, {"flmbox", c.flmbox.run}}
	runs := make([]*moduleRun, len(sides))
	outs := make([]string, len(sides))
	var wg sync.WaitGroup
	for i, side := range sides {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			out, err := side.run(ctx, m, script)
			runs[i] = parseOutcomes(m.name, out)
			runs[i].took, runs[i].err, outs[i] = time.Since(start), err, out
		}()
	}
	wg.Wait()
	c.runs++
	if dir := os.Getenv(conformanceOutEnv); dir != "" {
		for i, side := range sides {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d-%s.out", m.name, c.runs, side.name)), []byte(outs[i]), 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	return runs[0], runs[1]
}

// bareRunsc runs scripts in new runsc containers with flmbox's own spec
// for a sandbox, as bench/runsc.go's raw baseline does: the same tree,
// read-only, /tmp, user, environment, limits and no network, and runsc's
// global flags as flmbox passes them; and the files of /etc that every
// container runtime writes.
type bareRunsc struct {
	state, bundles string
	opts           []runtime.SpecOpt
}

func newBareRunsc(t *testing.T, cachedTree string, imageEnv []string) *bareRunsc {
	b := &bareRunsc{state: t.TempDir(), bundles: t.TempDir()}
	// runsc --network=none keeps a network namespace mounted in its root.
	t.Cleanup(func() { unix.Unmount(filepath.Join(b.state, "null-netns"), unix.MNT_DETACH) })

	// A copy of flmbox's cached tree: runsc makes the mount points of binds
	// that the tree lacks (/etc/hosts) in the tree itself, and flmbox's
	// cache is not ours to write. Its directories are new and its files
	// hard links (the container's root is read-only, and runsc only adds
	// files): seconds, where a copy of the data-science variant's 1.2 GiB
	// took 53 s. A whole copy where links cannot be made.
	tree := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", "--link", cachedTree, tree).CombinedOutput(); err != nil {
		t.Logf("link the cached tree's files (%v: %s); copying them", err, lastLines(string(out), 3))
		if err := os.RemoveAll(tree); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", "--reflink=auto", cachedTree, tree).CombinedOutput(); err != nil {
			t.Fatalf("copy the cached tree: %v\n%s", err, out)
		}
	}

	// What docker, podman and Kubernetes write into every container (issue
	// 25): without it "localhost" does not resolve with no network, and a
	// user of docker with runsc would not see that. docker's lines, and the
	// host name on 127.0.1.1 as Debian and podman have it.
	etc := t.TempDir()
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n" +
		"127.0.1.1\tsandbox\n"
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "hostname"), []byte("sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// flmbox's environment for a sandbox, but PYTHONUNBUFFERED: it is the
	// agent's own need, which must not reach the snippet's processes. And
	// HOSTNAME, as docker sets it.
	env := slices.DeleteFunc(sandbox.Environment(imageEnv, []string{"HOSTNAME=sandbox"}), func(kv string) bool {
		return strings.HasPrefix(kv, "PYTHONUNBUFFERED=")
	})
	// The spec's host name is "sandbox".
	b.opts = []runtime.SpecOpt{
		runtime.WithRootfs(tree),
		runtime.WithTmp(sandbox.DefaultTmpBytes),
		runtime.WithUser(sandbox.UID, sandbox.GID),
		runtime.WithEnv(env),
		runtime.WithNetwork(runtime.NetworkNone),
		runtime.WithBind(filepath.Join(etc, "hosts"), "/etc/hosts", true),
		runtime.WithBind(filepath.Join(etc, "hostname"), "/etc/hostname", true),
	}
	return b
}

// run runs script as a new container's first process (sh -c, or python3 -c
// as a Python snippet runs), with m's limits, and returns its output; the
// container is deleted afterwards.
func (b *bareRunsc) run(ctx context.Context, m testModule, script snippet) (string, error) {
	argv := []string{"sh", "-c", script.code}
	if script.language == "python" {
		argv = []string{"python3", "-c", script.code}
	}
	spec, err := runtime.GenerateSpec(append(slices.Clone(b.opts), runtime.WithLimits(runtime.Limits(m.limits())), runtime.WithArgs(argv...))...)
	if err != nil {
		return "", err
	}
	bundle, err := os.MkdirTemp(b.bundles, "bundle-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(bundle)
	data, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return "", err
	}
	id := make([]byte, 8)
	rand.Read(id)
	name := "flmbox-conformance-" + hex.EncodeToString(id)
	runsc := func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, runscPath, append([]string{"--root", b.state, "--network=none", "--host-uds=create"}, args...)...)
	}
	defer runsc(context.Background(), "delete", "--force", name).Run()
	cmd := runsc(ctx, "run", "--bundle", bundle, name)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("runsc run: %w: %s", err, lastLines(stderr.String(), 10))
	}
	return stdout.String(), nil
}

// flmboxRun runs scripts as a user would: flmbox run --image, a new
// sandbox each time.
type flmboxRun struct{ root, ref string }

// run runs script with m's limits: a flag only for what is not flmbox's
// default.
func (f *flmboxRun) run(ctx context.Context, m testModule, script snippet) (string, error) {
	args := []string{"--root", f.root, "--runsc", runscPath, "run", "--image", f.ref, "--language", script.language,
		"--timeout", (m.runTimeout() + time.Minute).String(),
		// All of it: a pytest module's outcomes pass the default 1MiB,
		// whose middle flmbox would leave out.
		"--max-output", conformanceMaxOutput}
	if m.memory != 0 {
		args = append(args, "--memory", fmt.Sprintf("%dMiB", m.memory>>20))
	}
	cmd := exec.CommandContext(ctx, flmboxBin, append(args, "-c", script.code)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("flmbox run: %w: %s", err, lastLines(stderr.String(), 10))
	}
	if strings.Contains(stderr.String(), "bytes left out") {
		return stdout.String(), fmt.Errorf("flmbox run: more output than --max-output %s: %s", conformanceMaxOutput, lastLines(stderr.String(), 10))
	}
	return stdout.String(), nil
}

// conformanceMaxOutput is flmbox run's --max-output for a module: its
// largest (wire.MaxMaxOutput).
const conformanceMaxOutput = "64MiB"

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// knownDifference is a row of the doc's table: what causes it, and the flag
// that lifts it or the issue that fixes it.
type knownDifference struct{ limit, flag string }

// fixedBy is the third cell of a known difference that no flag lifts: the
// issue that will fix it ("issue 39 fixes it"), whose merge removes the row.
var fixedBy = regexp.MustCompile(`\bissue \d+\b`)

// readKnownDifferences reads the table of conformanceDoc whose first
// column is "test id": test id | the flmbox limit that causes it | the flag
// that lifts it (a cell with "--"), or the issue that fixes it.
func readKnownDifferences(t *testing.T) map[string]knownDifference {
	t.Helper()
	doc, err := os.ReadFile(conformanceDoc)
	if err != nil {
		t.Fatal(err)
	}
	known, err := parseKnownDifferences(string(doc))
	if err != nil {
		t.Fatalf("%s: %v", conformanceDoc, err)
	}
	return known
}

func parseKnownDifferences(doc string) (map[string]knownDifference, error) {
	rows, err := docTable(doc, "test id")
	if err != nil {
		return nil, err
	}
	known := map[string]knownDifference{}
	for _, r := range rows {
		if len(r.cells) != 3 || r.cells[0] == "" || r.cells[1] == "" || !strings.Contains(r.cells[2], "--") && !fixedBy.MatchString(r.cells[2]) {
			return nil, fmt.Errorf("line %d: want | test id | the flmbox limit that causes it | the flag that lifts it, or the issue that fixes it |", r.line)
		}
		if _, dup := known[r.cells[0]]; dup {
			return nil, fmt.Errorf("line %d: %s twice", r.line, r.cells[0])
		}
		known[r.cells[0]] = knownDifference{limit: r.cells[1], flag: r.cells[2]}
	}
	return known, nil
}

// docRow is a row of a markdown table: its cells, trimmed of spaces and of
// the backticks around a whole cell, and its line number.
type docRow struct {
	cells []string
	line  int
}

// docTable returns the rows of the one markdown table of doc whose first
// header cell is header.
func docTable(doc, header string) ([]docRow, error) {
	var rows []docRow
	in, found := false, false
	for i, line := range strings.Split(doc, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			in = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
			if c := strings.Trim(cells[j], "`"); !strings.Contains(c, "`") {
				cells[j] = c
			}
		}
		switch {
		case !in && strings.EqualFold(cells[0], header):
			if found {
				return nil, fmt.Errorf("line %d: a second table headed %q", i+1, header)
			}
			in, found = true, true
		case !in || strings.Trim(strings.Join(cells, ""), "-: ") == "":
		default:
			rows = append(rows, docRow{cells: cells, line: i + 1})
		}
	}
	if !found {
		return nil, fmt.Errorf("no table headed %q", header)
	}
	return rows, nil
}

// TestConformanceDoc checks docs/CONFORMANCE.md against this file: its
// table of known differences parses and names tests of listed modules, and
// its table of modules is the two lists.
func TestConformanceDoc(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(conformanceDoc)
	if err != nil {
		t.Fatal(err)
	}
	known, err := parseKnownDifferences(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	for id := range known {
		if !slices.ContainsFunc(conformanceFull, func(m testModule) bool { return m.owns(id) }) {
			t.Errorf("known difference %s: not a test of a module of the full list", id)
		}
	}
	rows, err := docTable(string(doc), "module")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, r := range rows {
		name, _, _ := strings.Cut(strings.TrimPrefix(r.cells[0], "`"), "`")
		if len(r.cells) < 2 {
			t.Fatalf("%s line %d: want | module | list | ...", conformanceDoc, r.line)
		}
		listed[name] = r.cells[1]
	}
	want := map[string]string{}
	for _, m := range conformanceFull {
		want[m.name] = "full"
	}
	for _, m := range conformanceShort {
		want[m.name] = "short"
	}
	if !maps.Equal(listed, want) {
		t.Errorf("%s's table of modules lists %v, want %v", conformanceDoc, listed, want)
	}
}

// TestConformanceDifferences checks the comparison on made-up runs.
func TestConformanceDifferences(t *testing.T) {
	t.Parallel()
	m := testModule{name: "test_x"}
	rec := func(id string, o outcome) string {
		b, _ := json.Marshal(map[string]string{"id": id, "outcome": string(o), "detail": "why"})
		return outcomeMarker + string(b) + "\n"
	}
	test := func(id string, o outcome) string { return rec(id, "started") + rec(id, o) }
	const a, b, c = "test.test_x.C.test_a", "test.test_x.C.test_b", "test.test_x.D.test_c"
	exit := exitMarker + "0\n"
	all := test(a, passed) + test(b, passed) + test(c, passed) + exit
	tests := []struct {
		name      string
		bare, flm string
		want      []string
	}{
		{"same", all, all, nil},
		{"failed", all, test(a, passed) + test(b, failed) + test(c, passed) + exit, []string{b}},
		{"error", all, test(a, errored) + test(b, passed) + test(c, passed) + exit, []string{a}},
		{"skipped", all, test(a, passed) + test(b, skipped) + test(c, passed) + exit, []string{b}},
		{"unexpected success", test(a, xfail) + test(b, passed) + exit, test(a, xpass) + test(b, passed) + exit, []string{a}},
		{"expected failure", test(a, passed) + exit, test(a, xfail) + exit, nil},
		{"fails on both sides", test(a, failed) + test(b, passed) + exit, test(a, errored) + test(b, passed) + exit, nil},
		{"skipped under bare runsc", test(a, skipped) + exit, test(a, failed) + exit, nil},
		{"missing", all, test(a, passed) + test(c, passed) + exit, []string{b}},
		{"subtest failed", all, test(a, passed) + rec(b, "started") + rec(b, failed) + test(c, passed) + exit, []string{b}},
		{"killed", all, test(a, passed) + rec(b, "started"), []string{m.name}},
		{"regrtest's timeout", all, test(a, passed) + rec(b, "started") + exit, []string{m.name}},
		{"killed and a failure before", all, test(a, failed) + rec(b, "started"), []string{a, m.name}},
		{"killed under bare runsc too", test(a, passed) + rec(b, "started"), test(a, passed) + rec(b, "started"), nil},
		{"class fixture", all, rec("setUpClass (test.test_x.C)", errored) + test(c, passed) + exit, []string{"setUpClass (test.test_x.C)"}},
		{"module fixture", all, rec("setUpModule (test.test_x)", errored) + exit, []string{"setUpModule (test.test_x)"}},
		{"class fixture skipped", all, rec("setUpClass (test.test_x.C)", skipped) + test(c, passed) + exit, []string{"setUpClass (test.test_x.C)"}},
		{"noise", "garbage\n" + all + "tail\n", "x" + all, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := differences(m, parseOutcomes(m.name, tt.bare), parseOutcomes(m.name, tt.flm))
			if !slices.Equal(got, tt.want) {
				t.Errorf("differences %q, want %q", got, tt.want)
			}
		})
	}
}

func TestConformanceMatchPatterns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ids   []string
		want  []string
		whole bool
	}{
		{[]string{"test.test_x.C.test_a", "test.test_x.C.test_b"}, []string{"test.test_x.C.test_a", "test.test_x.C.test_b"}, false},
		{[]string{"test.test_x.C.test_[1]", "test.test_x.C.test_*?"}, []string{"test.test_x.C.test_[[]1]", "test.test_x.C.test_[*][?]"}, false},
		{[]string{"setUpClass (test.test_x.C)", "tearDownClass (test.test_x.D)"}, []string{"test.test_x.C.*", "test.test_x.D.*"}, false},
		{[]string{"test.test_x.C.test_a", "setUpModule (test.test_x)"}, nil, true},
	}
	for _, tt := range tests {
		got, whole := matchPatterns(tt.ids)
		if !slices.Equal(got, tt.want) || whole != tt.whole {
			t.Errorf("matchPatterns(%q) = %q, %v; want %q, %v", tt.ids, got, whole, tt.want, tt.whole)
		}
	}
}
