//go:build integration

package integration

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// BenchmarkPipcacheInstall measures, side by side in one run and in
// alternating order, `pip install` of a small pure-Python wheel in a fresh
// sandbox: from the wheel cache with --network none, against from a
// loopback PEP 503 index with --network host (a wheel of the same shape
// that the cache does not hold). What is timed is the `flmbox run
// --sandbox` process that runs pip; creating and removing the sandbox are
// not. It reports figures and the ratio; it asserts nothing about speed.
// Rounds: FLMBOX_BENCH_ROUNDS (default 9).
func BenchmarkPipcacheInstall(b *testing.B) {
	reg := startRegistry(b)
	root := b.TempDir()
	b.Cleanup(func() { unix.Unmount(filepath.Join(stateroot.Runsc(root), "null-netns"), unix.MNT_DETACH) })
	mustFlmbox(b, root, "prewarm", "--platform", "linux/amd64", reg.digestRef())
	mustFlmbox(b, root, "pipcache", "add", writeTestWheel(b, b.TempDir(), "flmbox-bench-cache", "1.0"))
	fn, wheel := testWheel("flmbox-bench-index", "1.0")
	ix := startIndex(b, map[string][]byte{fn: wheel})

	install := func(name string, network string, pipArgs string) time.Duration {
		mustFlmbox(b, root, "sandbox", "create", "--name", name, "--image", reg.digestRef(), "--network", network)
		defer mustFlmbox(b, root, "sandbox", "rm", name)
		return timeCmd(b, flmboxBin, "--root", root, "--runsc", runscPath, "run", "--sandbox", name, "-l", "shell", "-c",
			"python3 -m pip install --quiet "+pipArgs)
	}
	var cache, index []time.Duration
	rounds := benchRounds(9)
	for i := range rounds {
		fromCache := func() { cache = append(cache, install(fmt.Sprint("c", i), "none", "flmbox-bench-cache")) }
		fromIndex := func() {
			index = append(index, install(fmt.Sprint("x", i), "host", "--index-url "+ix.simpleURL()+" flmbox-bench-index"))
		}
		if i%2 == 0 {
			fromCache()
			fromIndex()
		} else {
			fromIndex()
			fromCache()
		}
	}
	c, x := summarize(cache), summarize(index)
	b.Logf("pip install from the cache, --network none   %s  (n=%d)", c, len(cache))
	b.Logf("pip install from a loopback index, host net  %s  (n=%d)", x, len(index))
	b.Logf("ratio of medians (cache/index)               %.2f× (target ≤ 1.00×)", c.median/x.median)
	b.ReportMetric(c.median, "cache-ms")
	b.ReportMetric(x.median, "index-ms")
	b.ReportMetric(c.median/x.median, "cache/index")
}
