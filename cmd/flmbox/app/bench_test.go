package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/urfave/cli/v2"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/flmbox/flmbox/rootfs"
)

// parseBench runs `flmbox bench ARGS` with an action that only reads the
// options.
func parseBench(t *testing.T, args ...string) (benchOptions, error) {
	t.Helper()
	cmd := benchCommand()
	var o benchOptions
	var err error
	cmd.Action = func(c *cli.Context) error {
		o, err = benchOptionsFrom(c)
		return nil
	}
	app := &cli.App{Commands: []*cli.Command{cmd}, Writer: &bytes.Buffer{}, ErrWriter: &bytes.Buffer{}}
	if rerr := app.Run(append([]string{"flmbox", "bench"}, args...)); rerr != nil {
		return o, rerr
	}
	return o, err
}

func TestBenchOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want benchOptions
		err  string
	}{
		{args: nil, want: benchOptions{pairs: 12, warmup: 5, rounds: 6, calls: 50, prewarmRounds: 5, batchSnippets: 64, idle: 2 * time.Second}},
		{args: []string{"--quick", "--json"}, want: benchOptions{pairs: 3, warmup: 2, rounds: 2, calls: 10, prewarmRounds: 2, batchSnippets: 16, idle: time.Second, json: true}},
		{args: []string{"--quick", "--calls", "7", "--warmup", "0", "--image", "oci-layout:/x"},
			want: benchOptions{image: "oci-layout:/x", pairs: 3, warmup: 0, rounds: 2, calls: 7, prewarmRounds: 2, batchSnippets: 16, idle: time.Second}},
		{args: []string{"--pairs", "1", "--rounds", "1", "--calls", "1"}, want: benchOptions{pairs: 1, warmup: 5, rounds: 1, calls: 1, prewarmRounds: 5, batchSnippets: 64, idle: 2 * time.Second}},
		{args: []string{"--pairs", "0"}, err: "--pairs 0"},
		{args: []string{"--rounds", "-1"}, err: "--rounds -1"},
		{args: []string{"--calls", "0"}, err: "--calls 0"},
		{args: []string{"--warmup", "-1"}, err: "--warmup -1"},
		{args: []string{"--calls", "100000"}, err: "want 1 to 10000"},
		{args: []string{"--calls", "many"}, err: "invalid value"},
		{args: []string{"--quick", "--pause", "20ms"}, want: benchOptions{pairs: 3, warmup: 2, rounds: 2, calls: 10, prewarmRounds: 2, batchSnippets: 16, idle: time.Second, pause: 20 * time.Millisecond}},
		{args: []string{"--pause", "2s"}, err: "--pause 2s"},
		{args: []string{"--pause", "-1ms"}, err: "--pause -1ms"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			got, err := parseBench(t, tc.args...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBenchRefusesArguments(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := Run(t.Context(), []string{"flmbox", "--root", t.TempDir(), "bench", "IMAGE"}, &stdout, &stderr)
	if code != exitFlmboxFailed || !strings.Contains(stderr.String(), "--image") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestBenchImage(t *testing.T) {
	c := testContext(t, "--root", t.TempDir())
	if got, err := benchImage(c, "oci-layout:/srv/x@sha256:"+strings.Repeat("a", 64)); err != nil || !strings.HasPrefix(got, "oci-layout:") {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := benchImage(c, "oci-layout:/srv/x@sha256:short"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a bad reference: %v", err)
	}
	if _, err := benchImage(c, ""); err == nil || !strings.Contains(err.Error(), "holds 0 images") || !strings.Contains(err.Error(), "--image") {
		t.Fatalf("an empty cache: %v", err)
	}
}

// testContext is a CLI context holding bench's private flags.
func testContext(t *testing.T, args ...string) *cli.Context {
	t.Helper()
	parent := cli.NewContext(newApp(&bytes.Buffer{}, &bytes.Buffer{}), flag.NewFlagSet("t", flag.ContinueOnError), nil)
	parent.Context = t.Context()
	c, err := benchContext(parent, args...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestBenchContext(t *testing.T) {
	c := testContext(t, "--root", "/r", "--runsc", "/bin/runsc", "--sandbox", "s1")
	if c.String("root") != "/r" || c.String("runsc") != "/bin/runsc" || c.String("sandbox") != "s1" || c.String("image") != "" {
		t.Fatalf("root %q runsc %q sandbox %q image %q", c.String("root"), c.String("runsc"), c.String("sandbox"), c.String("image"))
	}
	o, err := sandboxOptionsFrom(c)
	if err != nil {
		t.Fatal(err)
	}
	if o.limits.CPUs != defaultCPUs || o.limits.Pids != defaultPids || o.tmpBytes != 256<<20 {
		t.Fatalf("defaults: %+v", o)
	}
}

func TestBenchStats(t *testing.T) {
	for _, tc := range []struct {
		in      []float64
		want    benchStats
		wantP95 float64
	}{
		{in: []float64{3, 1, 2}, want: benchStats{Median: 2, Min: 1, Max: 3, N: 3}, wantP95: 3},
		{in: []float64{4, 1, 3, 2}, want: benchStats{Median: 2.5, Min: 1, Max: 4, N: 4}, wantP95: 4},
		{in: []float64{7}, want: benchStats{Median: 7, Min: 7, Max: 7, N: 1}, wantP95: 7},
	} {
		if got := summarize(tc.in); got != tc.want {
			t.Errorf("summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
		if got := p95(slices.Sorted(slices.Values(tc.in))); got != tc.wantP95 {
			t.Errorf("p95(%v) = %v, want %v", tc.in, got, tc.wantP95)
		}
	}
	// p95 by nearest rank: of 1..100 it is 95, of 1..20 it is 19.
	var hundred, twenty []float64
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, float64(i))
		if i <= 20 {
			twenty = append(twenty, float64(i))
		}
	}
	if got := p95(hundred); got != 95 {
		t.Errorf("p95(1..100) = %v", got)
	}
	if got := p95(twenty); got != 19 {
		t.Errorf("p95(1..20) = %v", got)
	}
	// Medians and p95s within rounds, then their medians.
	med, p := roundSummary([][]float64{{1, 2, 3, 100}, {2, 3, 4, 5}, {10, 3, 4, 5}})
	if med != 3.5 || p != 10 {
		t.Errorf("roundSummary: median %v, p95 %v; want 3.5 and 10", med, p)
	}
	if got := summarize(nil); got != (benchStats{}) {
		t.Errorf("summarize(nil) = %+v", got)
	}
	if got := ms(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("ms = %v", got)
	}
}

// sampleReport is a report as a run fills it.
func sampleReport(retained bool, crane bool) *benchReport {
	s := func(m float64) benchStats { return benchStats{Median: m, Min: m - 1, Max: m + 1, N: 3} }
	rep := &benchReport{
		Allocation: allocationReport{FreshMS: s(170), RawRunscMS: s(120), FreshInprocessMS: s(140)},
		Batch:      batchReport{Snippets: 64, Parallel: 2, SerialS: 40, ParallelS: 21, SnippetNativeS: 0.2},
		Prewarm:    prewarmReport{ColdMS: 1100, HitMS: 3, Cold: s(1100), Hit: s(3)},
		Memory:     memoryReport{SandboxKiB: 60000, BareRunscKiB: 30000, SandboxRSSKiB: 120000, BareRunscRSSKiB: 65000, SandboxProcesses: 9, BareRunscProcesses: 6},
		Runsc:      runscReport{Path: "/usr/local/bin/runsc", Version: "v1", Platform: "systrap"},
		Image:      imageReport{Ref: "oci-layout:/x@sha256:1", Platform: "linux/amd64", SizeBytes: 1 << 20},
		Settings:   settingsReport{Pairs: 3, Warmup: 2, Rounds: 2, Calls: 10, PrewarmRounds: 2, CPUs: 2},
	}
	for _, api := range []string{"sandbox", "batch"} {
		for _, lang := range []string{"python", "shell"} {
			rep.Warm = append(rep.Warm, warmReport{API: api, Language: lang, MedianMS: 19, P95MS: 29, InprocessMedianMS: 16,
				RunscExecMedianMS: 26, NativeMedianMS: 14, Calls: 20})
		}
	}
	if retained {
		r := s(80)
		rep.Allocation.RetainedMS = &r
	}
	if crane {
		c := s(1400)
		rep.Prewarm.CraneTar, rep.Prewarm.CraneTarMS = &c, &c.Median
	}
	return rep
}

// TestBenchJSONSchema checks issue 4's schema: every key, its type, and
// null exactly where the issue allows it.
func TestBenchJSONSchema(t *testing.T) {
	for _, tc := range []struct{ retained, crane bool }{{false, true}, {true, false}} {
		t.Run(fmt.Sprintf("retained=%t,crane=%t", tc.retained, tc.crane), func(t *testing.T) {
			var buf bytes.Buffer
			if err := printBench(&buf, sampleReport(tc.retained, tc.crane), true); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(strings.TrimSpace(buf.String()), "\n"); n != 0 {
				t.Fatalf("want one JSON line, got %d more", n)
			}
			var obj map[string]any
			dec := json.NewDecoder(&buf)
			dec.UseNumber()
			if err := dec.Decode(&obj); err != nil {
				t.Fatal(err)
			}
			if err := validateBenchJSON(obj, tc.retained, tc.crane); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// validateBenchJSON checks the schema of `flmbox bench --json`. The
// integration test has its own copy, against a real run.
func validateBenchJSON(obj map[string]any, retained, crane bool) error {
	isStats := func(v any) error {
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("not an object: %v", v)
		}
		for _, k := range []string{"median", "min", "max", "n"} {
			if _, ok := m[k].(json.Number); !ok {
				return fmt.Errorf("%s: not a number: %v", k, m[k])
			}
		}
		return nil
	}
	section := func(name string) map[string]any { m, _ := obj[name].(map[string]any); return m }
	numbers := func(m map[string]any, keys ...string) error {
		for _, k := range keys {
			if _, ok := m[k].(json.Number); !ok {
				return fmt.Errorf("%s: not a number: %v", k, m[k])
			}
		}
		return nil
	}
	alloc := section("allocation")
	for _, k := range []string{"fresh_ms", "raw_runsc_ms"} {
		if err := isStats(alloc[k]); err != nil {
			return fmt.Errorf("allocation.%s: %w", k, err)
		}
	}
	if v, ok := alloc["retained_ms"]; !ok || (v == nil) == retained {
		return fmt.Errorf("allocation.retained_ms: %v (present %t)", v, ok)
	}
	warm, _ := obj["warm"].([]any)
	if len(warm) != 4 {
		return fmt.Errorf("warm: %d entries, want 4", len(warm))
	}
	seen := map[string]bool{}
	for _, w := range warm {
		m, _ := w.(map[string]any)
		api, _ := m["api"].(string)
		lang, _ := m["language"].(string)
		if (api != "sandbox" && api != "batch") || (lang != "python" && lang != "shell") {
			return fmt.Errorf("warm: api %q, language %q", api, lang)
		}
		seen[api+"/"+lang] = true
		if err := numbers(m, "median_ms", "p95_ms", "inprocess_median_ms", "runsc_exec_median_ms", "native_median_ms"); err != nil {
			return fmt.Errorf("warm %s/%s: %w", api, lang, err)
		}
	}
	if len(seen) != 4 {
		return fmt.Errorf("warm: %v, want every api and language", seen)
	}
	if err := numbers(section("batch"), "snippets", "parallel", "serial_s", "parallel_s"); err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	pw := section("prewarm")
	if err := numbers(pw, "cold_ms", "hit_ms"); err != nil {
		return fmt.Errorf("prewarm: %w", err)
	}
	if v, ok := pw["crane_tar_ms"]; !ok || (v == nil) == crane {
		return fmt.Errorf("prewarm.crane_tar_ms: %v (present %t)", v, ok)
	}
	if err := numbers(section("memory"), "sandbox_kib", "bare_runsc_kib"); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	rs := section("runsc")
	for _, k := range []string{"path", "version", "platform"} {
		if s, _ := rs[k].(string); s == "" {
			return fmt.Errorf("runsc.%s: %v", k, rs[k])
		}
	}
	return nil
}

func TestBenchTable(t *testing.T) {
	var buf bytes.Buffer
	if err := printBench(&buf, sampleReport(false, true), false); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"FIGURE", "REFERENCE", "raw runsc 120 ms", "1.42×", "191 ms", "82 ms", "n/a",
		"warm call, sandbox API, python", "25.16 ms", "runsc exec 26.0 ms", "chroot 14.0 ms",
		"--parallel 1 40.0 s", "crane export | tar -x 1400 ms", "0.79×", "≤ 20 ms", "58.6 MiB", "systrap",
		"10 calls per round (back to back)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	printBench(&buf, sampleReport(true, false), false)
	if out := buf.String(); !strings.Contains(out, "crane export | tar -x n/a") || !strings.Contains(out, "80.0 ms") {
		t.Errorf("without crane, with retained:\n%s", out)
	}
	paced := sampleReport(false, true)
	paced.Settings.PauseMS = 20
	buf.Reset()
	printBench(&buf, paced, false)
	if out := buf.String(); !strings.Contains(out, "(each after a 20 ms pause)") {
		t.Errorf("paced warm calls:\n%s", out)
	}
}

func TestThroughputWant(t *testing.T) {
	for _, n := range []int64{0, 1, 2, 10, 12345} {
		var sum big.Int
		for i := int64(0); i < n; i++ {
			sum.Add(&sum, big.NewInt(i*i))
		}
		if got, want := throughputWant(n), sum.String()+"\n"; got != want {
			t.Errorf("throughputWant(%d) = %q, want %q", n, got, want)
		}
	}
	if got := throughputCode(5); got != "print(sum(i * i for i in range(5)))" {
		t.Errorf("throughputCode = %q", got)
	}
}

func TestNamesBundle(t *testing.T) {
	const dir = "/var/lib/flmbox/sandboxes/a"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"runsc-sandbox", "--root=/r", "boot", "--bundle=" + dir, "id"}, true},
		{[]string{"runsc-gofer", "gofer", "--bundle", dir, "--spec-fd=3"}, true},
		{[]string{"runsc", "-bundle", dir}, true},
		{[]string{"runsc-sandbox", "boot", "--bundle=" + dir + "0"}, false},
		{[]string{"runsc-gofer", "gofer", "--bundle", dir + "/x"}, false},
		{[]string{"cat", "bundle", dir}, false},
		{[]string{"runsc", "--bundle"}, false},
	} {
		cmdline := []byte(strings.Join(tc.args, "\x00") + "\x00")
		if got := namesBundle(cmdline, dir); got != tc.want {
			t.Errorf("%q: got %t", tc.args, got)
		}
	}
}

// TestBundleProcesses finds a real process tree by its command line and
// reads its memory.
func TestBundleProcesses(t *testing.T) {
	bundle := filepath.Join(t.TempDir(), "bundle dir")
	// sh names the bundle (as runsc's processes do) and starts a child.
	cmd := exec.Command("sh", "-c", "sleep 30 & wait", "sh", "--bundle", bundle)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); len(pids) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		pids, _ = bundleProcesses(bundle)
	}
	if len(pids) != 2 || pids[0] != cmd.Process.Pid {
		t.Fatalf("processes %v, want sh (%d) and its sleep", pids, cmd.Process.Pid)
	}
	m, err := processMemory(pids)
	if err != nil {
		t.Fatal(err)
	}
	if m.processes != 2 || m.rss <= 0 || m.pss <= 0 || m.pss > m.rss {
		t.Fatalf("memory %+v", m)
	}
	if _, err := bundleProcesses(bundle + "-none"); err == nil {
		t.Fatal("found processes of a bundle nobody runs")
	}
}

// testImage is a random image for linux/arch.
func testImage(t *testing.T, arch string) v1.Image {
	t.Helper()
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestRegistryPush copies a two-platform image from an OCI layout whose
// index.json wraps the index (as the test image's does) into the loopback
// registry: every manifest, but the blobs of the chosen platform only.
func TestRegistryPush(t *testing.T) {
	amd, arm := testImage(t, "amd64"), testImage(t, "arm64")
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	idxDigest, _ := idx.Digest()
	amdDigest, _ := amd.Digest()
	armDigest, _ := arm.Digest()

	reg, err := startRegistry()
	if err != nil {
		t.Fatal(err)
	}
	defer reg.close()
	image := "oci-layout:" + dir + "@" + idxDigest.String()
	if err := reg.push(t.Context(), image, idxDigest.String(), amdDigest.String()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []v1.Hash{idxDigest, amdDigest, armDigest} {
		if _, err := remote.Head(reg.repo.Digest(d.String())); err != nil {
			t.Errorf("manifest %s: %v", d, err)
		}
	}
	blobs := func(img v1.Image) []v1.Hash {
		m, _ := img.Manifest()
		out := []v1.Hash{m.Config.Digest}
		for _, l := range m.Layers {
			out = append(out, l.Digest)
		}
		return out
	}
	for _, d := range blobs(amd) {
		l, err := remote.Layer(reg.repo.Digest(d.String()))
		if err == nil {
			_, err = l.Size()
		}
		if err != nil {
			t.Errorf("amd64 blob %s: %v", d, err)
		}
	}
	for _, d := range blobs(arm) {
		if l, err := remote.Layer(reg.repo.Digest(d.String())); err == nil {
			if _, err := l.Size(); err == nil {
				t.Errorf("arm64 blob %s was copied", d)
			}
		}
	}
	// flmbox prewarms it from there.
	store, err := rootfs.OpenStore(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Prewarm(t.Context(), reg.ref(idxDigest.String()), &rootfs.PullOptions{Platform: rootfs.Platform{OS: "linux", Architecture: "amd64"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ManifestDigest != amdDigest.String() || res.IndexDigest != idxDigest.String() {
		t.Fatalf("prewarmed %+v", res)
	}

	// Other ways of naming what is in the layout.
	for _, d := range []v1.Hash{amdDigest, idxDigest} {
		if _, err := sourceObject(t.Context(), "oci-layout:"+dir, d.String()); err != nil {
			t.Errorf("find %s: %v", d, err)
		}
	}
	root, _ := p.ImageIndex()
	rootDigest, _ := root.Digest()
	if _, err := sourceObject(t.Context(), "oci-layout:"+dir, rootDigest.String()); err != nil {
		t.Errorf("find index.json itself: %v", err)
	}
	missing := "sha256:" + strings.Repeat("0", 64)
	if _, err := sourceObject(t.Context(), "oci-layout:"+dir, missing); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a missing digest: %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}
