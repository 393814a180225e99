//go:build integration

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// stats is a median/min/max summary in milliseconds.
type stats struct{ median, min, max float64 }

func summarize(d []time.Duration) stats {
	ms := make([]float64, len(d))
	for i, x := range d {
		ms[i] = float64(x.Microseconds()) / 1000
	}
	slices.Sort(ms)
	med := ms[len(ms)/2]
	if len(ms)%2 == 0 {
		med = (ms[len(ms)/2-1] + ms[len(ms)/2]) / 2
	}
	return stats{median: med, min: ms[0], max: ms[len(ms)-1]}
}

func (s stats) String() string {
	return fmt.Sprintf("median %7.1f ms  min %7.1f  max %7.1f", s.median, s.min, s.max)
}

func benchRounds(def int) int {
	if n, err := strconv.Atoi(os.Getenv("FLMBOX_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return def
}

// timeCmd runs a command and returns its wall time.
func timeCmd(b *testing.B, name string, args ...string) time.Duration {
	b.Helper()
	cmd := exec.Command(name, args...)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return time.Since(start)
}

// BenchmarkPrewarm measures, side by side in one run and in alternating
// order, a cold `flmbox prewarm` of the test image from a loopback registry
// against `crane export REF - | tar -x` of the same image, and a cache-hit
// `flmbox prewarm` by index digest with the registry stopped. It reports
// figures and ratios; it asserts nothing about speed.
func BenchmarkPrewarm(b *testing.B) {
	crane, err := exec.LookPath("crane")
	if err != nil {
		b.Fatal("crane is not on PATH: make bench installs it")
	}
	reg := ownRegistry(b)
	rounds := benchRounds(7)
	work := b.TempDir()
	craneRef := reg.host + "/" + repo + "@" + img.AMD64Digest.String()
	var flm, crn []time.Duration
	// Trees are removed only at the end: ext4 scans past recently deleted
	// inodes when it allocates new ones (for up to minutes), which slows
	// whatever unpacks right after a removal, by up to several times.
	for i := range rounds {
		runFlmbox := func() {
			root := filepath.Join(work, fmt.Sprint("root", i))
			flm = append(flm, timeCmd(b, flmboxBin, "--root", root, "prewarm", "--platform", "linux/amd64", reg.digestRef()))
		}
		runCrane := func() {
			dir := filepath.Join(work, fmt.Sprint("crane", i))
			os.MkdirAll(dir, 0o755)
			crn = append(crn, timeCmd(b, "sh", "-c", fmt.Sprintf("%s export %s - | tar -x -C %s", crane, craneRef, dir)))
		}
		if i%2 == 0 {
			runFlmbox()
			runCrane()
		} else {
			runCrane()
			runFlmbox()
		}
		exec.Command("sync").Run()
	}
	root := filepath.Join(work, "root0")
	reg.srv.Close()
	var hit []time.Duration
	for range 5 * rounds {
		hit = append(hit, timeCmd(b, flmboxBin, "--root", root, "prewarm", "--platform", "linux/amd64", reg.digestRef()))
	}
	f, c, h := summarize(flm), summarize(crn), summarize(hit)
	b.Logf("cold flmbox prewarm          %s  (n=%d)", f, len(flm))
	b.Logf("crane export | tar -x        %s  (n=%d)", c, len(crn))
	b.Logf("ratio of medians             %.2f× (target ≤ 0.80×)", f.median/c.median)
	b.Logf("cache-hit prewarm, reg. down %s  (n=%d, target ≤ 20 ms)", h, len(hit))
	b.ReportMetric(f.median, "cold-ms")
	b.ReportMetric(c.median, "crane-tar-ms")
	b.ReportMetric(f.median/c.median, "cold/crane")
	b.ReportMetric(h.median, "hit-ms")
}
