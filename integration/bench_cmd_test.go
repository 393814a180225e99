//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchImageRef is the test image as flmbox bench takes it.
func benchImageRef() string { return "oci-layout:" + img.LayoutPath + "@" + img.IndexDigest.String() }

// TestBenchQuickJSON runs `flmbox bench --quick --json` and checks that it
// prints exactly one object with the report's schema, every figure filled from
// a real measurement, and that it leaves nothing behind. Speed is logged,
// never asserted.
func TestBenchQuickJSON(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	start := time.Now()
	// Paced warm calls: every method waits 5 ms before each call. Fewer
	// pairs and calls than --quick's: what is tested is the report's
	// schema and that every figure is a measurement.
	res := flmbox(t, root, "bench", "--quick", "--json", "--pause", "5ms", "--image", benchImageRef(),
		"--pairs", fmt.Sprint(benchPairs), "--rounds", fmt.Sprint(benchWarmRounds), "--calls", fmt.Sprint(benchCalls), "--warmup", "1",
		"--prewarm-rounds", "1", "--big-image", "16MiB")
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr: %s", res.code, res.stderr)
	}
	t.Logf("flmbox bench --quick took %s", time.Since(start).Round(time.Second))
	if res.stderr != "" {
		t.Errorf("stderr with --json: %q", res.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	dec.UseNumber()
	var rep map[string]any
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("decode %q: %v", res.stdout, err)
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		t.Fatalf("more than one JSON value on stdout: %q", res.stdout)
	}
	checkBenchReport(t, rep)
	if p := (jsonWalker{t: t}).num(rep, "settings.pause_ms"); p != 5 {
		t.Errorf("settings.pause_ms = %v, want 5", p)
	}
	assertBenchCleaned(t, root)
}

// TestBenchQuickJSON's --pairs, --rounds and --calls.
const benchPairs, benchWarmRounds, benchCalls = 1, 1, 5

// checkBenchReport checks the schema and that every figure is a real one.
func checkBenchReport(t *testing.T, rep map[string]any) {
	t.Helper()
	j := jsonWalker{t: t}
	for _, k := range []string{"fresh_ms", "retained_ms", "raw_runsc_ms", "fresh_inprocess_ms"} {
		j.stats(rep, "allocation."+k, benchPairs)
	}

	warm, _ := rep["warm"].([]any)
	seen := map[string]bool{}
	for _, w := range warm {
		api, lang := j.str(w, "api"), j.str(w, "language")
		if (api != "sandbox" && api != "batch") || (lang != "python" && lang != "shell") {
			t.Errorf("warm entry api %q language %q", api, lang)
		}
		seen[api+"/"+lang] = true
		for _, k := range []string{"median_ms", "p95_ms", "inprocess_median_ms", "runsc_exec_median_ms", "native_median_ms"} {
			j.positive(w, k)
		}
		if j.num(w, "p95_ms") < j.num(w, "median_ms") {
			t.Errorf("warm %s/%s: p95 below the median", api, lang)
		}
		if n := j.num(w, "calls"); n != benchWarmRounds*benchCalls {
			t.Errorf("warm %s/%s: %v calls, want %d rounds of %d", api, lang, n, benchWarmRounds, benchCalls)
		}
	}
	if len(warm) != 4 || len(seen) != 4 {
		t.Errorf("warm: %d entries (%v), want sandbox and batch × python and shell", len(warm), seen)
	}

	for _, k := range []string{"enter_first_result_ms", "socket_ms", "enter_ms", "fresh_ms"} {
		j.stats(rep, "instance."+k, benchPairs)
	}
	iwarm, _ := j.get(rep, "instance.warm").([]any)
	for i, lang := range []string{"python", "shell"} {
		if i >= len(iwarm) {
			t.Errorf("instance.warm: %d entries, want python and shell", len(iwarm))
			break
		}
		if got := j.str(iwarm[i], "language"); got != lang {
			t.Errorf("instance.warm[%d]: language %q, want %q", i, got, lang)
		}
		for _, k := range []string{"median_ms", "p95_ms", "cli_median_ms", "cli_p95_ms"} {
			j.positive(iwarm[i], k)
		}
		if n := j.num(iwarm[i], "calls"); n != benchWarmRounds*benchCalls {
			t.Errorf("instance.warm[%d]: %v calls, want %d rounds of %d", i, n, benchWarmRounds, benchCalls)
		}
	}

	for _, k := range []string{"batch.snippets", "batch.parallel", "batch.serial_s", "batch.parallel_s", "batch.snippet_native_s",
		"prewarm.cold_ms", "prewarm.hit_ms", "memory.sandbox_kib", "memory.bare_runsc_kib", "memory.sandbox_rss_kib", "memory.bare_runsc_rss_kib"} {
		j.positive(rep, k)
	}
	for _, k := range []string{"memory.sandbox_processes", "memory.bare_runsc_processes"} {
		if n := j.num(rep, k); n < 2 {
			t.Errorf("%s = %v: runsc's sandbox and gofer at least", k, n)
		}
	}
	j.stats(rep, "prewarm.cold_stats", 1)
	// The big image's section, at 16 MiB: one round. The disk's growth is
	// a figure of the whole file system, which the suite's other tests
	// shrink as they remove their roots: present, not asserted.
	j.stats(rep, "prewarm.big.cold_stats", 1)
	if b, d := j.num(rep, "prewarm.big.bytes"), j.num(rep, "prewarm.big.peak_disk_bytes"); b != 16<<20 || d < 0 || j.num(rep, "prewarm.big.layers") != 4 {
		t.Errorf("prewarm.big: %v bytes, %v layers, disk grew %v", b, j.num(rep, "prewarm.big.layers"), d)
	}
	crane := j.get(rep, "prewarm").(map[string]any)["crane_tar_ms"]
	if _, err := exec.LookPath("crane"); err == nil {
		j.positive(rep, "prewarm.crane_tar_ms")
	} else if crane != nil {
		t.Errorf("prewarm.crane_tar_ms = %v without crane on PATH, want null", crane)
	}

	// Egress: a first result each pair, --quick's 1 download and a run
	// of its 50 connects a round, a side.
	const connects = benchWarmRounds * 50
	for k, n := range map[string]float64{"first_result_ms": benchPairs, "none_first_result_ms": benchPairs, "download_ms": 1, "host_download_ms": 1,
		"host_network_download_ms": 1, "connect_ms": connects, "host_connect_ms": connects, "host_network_connect_ms": connects} {
		j.stats(rep, "egress."+k, n)
	}
	for _, k := range []string{"download_mib_per_s", "host_download_mib_per_s", "host_network_download_mib_per_s", "connect_ms.p95"} {
		j.positive(rep, "egress."+k)
	}
	if got := j.num(rep, "egress.download_bytes"); got != 100<<20 {
		t.Errorf("egress.download_bytes = %v, want 100 MiB", got)
	}

	// A long call: a round a pair of a loop timed by itself, as a call,
	// by runsc exec and in bare runsc; the default
	// sandbox (--cpus 1) is shown one CPU, where bare runsc shows at least
	// two. The test image has no numpy.
	for _, k := range []string{"flmbox_ms", "runsc_exec_ms", "bare_runsc_ms"} {
		j.stats(rep, "long.python."+k, benchPairs)
	}
	if cpus, bare := j.num(rep, "long.python.cpus"), j.num(rep, "long.python.bare_cpus"); cpus != 1 || bare < 2 {
		t.Errorf("long.python: %v CPUs shown by flmbox, %v by bare runsc; want 1 and at least 2", cpus, bare)
	}
	if got := j.str(rep, "long.numpy_missing"); !strings.Contains(got, "numpy") {
		t.Errorf("long.numpy_missing = %q, want why there is no numpy figure", got)
	}

	if got := j.str(rep, "runsc.path"); got != runscPath {
		t.Errorf("runsc.path %q, want %q", got, runscPath)
	}
	j.str(rep, "runsc.version")
	j.str(rep, "runsc.platform")
	if got := j.str(rep, "image.manifest_digest"); got != img.AMD64Digest.String() {
		t.Errorf("image.manifest_digest %q, want %s", got, img.AMD64Digest)
	}
	if got := j.str(rep, "image.index_digest"); got != img.IndexDigest.String() {
		t.Errorf("image.index_digest %q, want %s", got, img.IndexDigest)
	}
}

// jsonWalker reads dotted paths of a decoded JSON value, failing the test
// where a value is missing or of the wrong type.
type jsonWalker struct{ t *testing.T }

func (j jsonWalker) get(v any, path string) any {
	j.t.Helper()
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			j.t.Errorf("%s: %v is not an object", path, v)
			return nil
		}
		if v, ok = m[k]; !ok {
			j.t.Errorf("%s: no key %q", path, k)
			return nil
		}
	}
	return v
}

func (j jsonWalker) num(v any, path string) float64 {
	j.t.Helper()
	n, ok := j.get(v, path).(json.Number)
	if !ok {
		j.t.Errorf("%s: not a number", path)
		return 0
	}
	f, _ := n.Float64()
	return f
}

func (j jsonWalker) positive(v any, path string) {
	j.t.Helper()
	if n := j.num(v, path); n <= 0 {
		j.t.Errorf("%s = %v, want a measurement", path, n)
	}
}

func (j jsonWalker) str(v any, path string) string {
	j.t.Helper()
	s, ok := j.get(v, path).(string)
	if !ok || s == "" {
		j.t.Errorf("%s: not a non-empty string", path)
	}
	return s
}

// stats checks an S object: {"median","min","max","n"}, n measurements.
func (j jsonWalker) stats(v any, path string, n float64) {
	j.t.Helper()
	lo, med, hi := j.num(v, path+".min"), j.num(v, path+".median"), j.num(v, path+".max")
	if lo <= 0 || lo > med || med > hi {
		j.t.Errorf("%s: min %v, median %v, max %v", path, lo, med, hi)
	}
	if got := j.num(v, path+".n"); got != n {
		j.t.Errorf("%s.n = %v, want %v", path, got, n)
	}
}

// TestBenchInterrupted interrupts the bench while it allocates sandboxes
// (the persistent one runs, fresh ones and raw runsc containers come and
// go): it must say so, exit 130 and leave nothing behind.
func TestBenchInterrupted(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cmd := exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "bench", "--quick", "--prewarm-rounds", "1", "--image", benchImageRef())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(5*time.Minute, func() { cmd.Process.Kill() })
	defer timer.Stop()
	var log strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		// The line comes before pair 2's allocations, with pair 3 and
		// later stages still to run: the signal lands while the bench
		// allocates, wherever in pair 2.
		if strings.Contains(sc.Text(), "allocation: pair 2") {
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Errorf("SIGINT: %v", err)
			}
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.Contains(log.String(), "bench interrupted") {
		t.Fatalf("%v; want exit 130 (SIGINT's, as a shell says) and a message\nstderr: %s", err, log.String())
	}
	assertBenchCleaned(t, root)
}

// assertBenchCleaned fails if the bench left anything under root: its
// directory, a mount, a process.
func assertBenchCleaned(t *testing.T, root string) {
	t.Helper()
	if m, _ := filepath.Glob(filepath.Join(root, "bench-*")); len(m) > 0 {
		t.Errorf("left behind: %v", m)
	}
	if info, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(info), root) {
		t.Errorf("mounts left under %s", root)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), root) {
			t.Errorf("process left: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// TestBenchDensity runs `flmbox bench --quick --density 2
// --density-suspended 2 --density-only --json`: three series (default
// spares, lazy spares, suspended), each with its points at 1 and 2, every
// sandbox answering at the end, real figures, and nothing left behind.
func TestBenchDensity(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	const n = 2
	res := flmbox(t, root, "bench", "--quick", "--density", fmt.Sprint(n), "--density-suspended", fmt.Sprint(n), "--density-only", "--json", "--image", benchImageRef())
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr: %s", res.code, res.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	dec.UseNumber()
	var rep map[string]any
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("decode %q: %v", res.stdout, err)
	}
	j := jsonWalker{t: t}
	if got := j.num(rep, "density.sandboxes"); got != n {
		t.Errorf("density.sandboxes = %v", got)
	}
	if got := j.num(rep, "density.limits.max_sandboxes"); got < n {
		t.Errorf("density.limits.max_sandboxes = %v", got)
	}
	series, _ := j.get(rep, "density.series").([]any)
	var names []string
	for _, s := range series {
		names = append(names, j.str(s, "name"))
		if c, na := j.num(s, "checked"), j.num(s, "not_answering"); c != n || na != 0 {
			t.Errorf("series %s: %v checked, %v not answering", j.str(s, "name"), c, na)
		}
		points, _ := j.get(s, "points").([]any)
		if len(points) < 2 {
			t.Fatalf("series %s: %d points", j.str(s, "name"), len(points))
		}
		last := points[len(points)-1]
		if got := j.num(last, "sandboxes"); got != n {
			t.Errorf("series %s: last point at %v sandboxes", j.str(s, "name"), got)
		}
		j.positive(last, "create_ms.median")
		j.positive(last, "cli_list_ms.median")
		if j.str(s, "name") == "suspended" {
			j.positive(last, "image_bytes")
			j.positive(last, "resume_ms.median")
		} else {
			j.positive(last, "pss_per_sandbox_kib")
			j.positive(last, "tasks_per_sandbox")
			j.positive(last, "call_ms.median")
		}
	}
	if strings.Join(names, ",") != "default,lazy,suspended" {
		t.Errorf("series %v, want default, lazy, suspended", names)
	}
	assertBenchCleaned(t, root)
}
