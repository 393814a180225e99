package app

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// batchSnippetSeconds is the CPU time of one throughput snippet, natively.
const batchSnippetSeconds = 0.2

// calibrationCode prints how many iterations of the throughput snippet's
// loop take 50 ms or more, and how long they took.
const calibrationCode = `import time
n = 1 << 14
while True:
    t = time.perf_counter()
    sum(i * i for i in range(n))
    d = time.perf_counter() - t
    if d >= 0.05:
        break
    n *= 2
print(n, d)
`

// throughputCode is a CPU-bound snippet of n iterations.
func throughputCode(n int64) string { return fmt.Sprintf("print(sum(i * i for i in range(%d)))", n) }

// throughputWant is what throughputCode(n) prints: the sum of the squares
// below n, (n-1)n(2n-1)/6.
func throughputWant(n int64) string {
	x := big.NewInt(n)
	r := new(big.Int).Mul(new(big.Int).Sub(x, big.NewInt(1)), x)
	r.Mul(r, new(big.Int).Sub(new(big.Int).Lsh(x, 1), big.NewInt(1)))
	return r.Div(r, big.NewInt(6)).String() + "\n"
}

// measureBatch times `flmbox run --batch FILE --image IMAGE` of CPU-bound
// Python snippets (each about 0.2 s natively, calibrated under chroot) with
// --parallel 1 and with the default, and checks every result.
func (b *bench) measureBatch(ctx context.Context) (batchReport, error) {
	rep := batchReport{Snippets: b.opts.batchSnippets, Parallel: runtime.NumCPU()}
	n, err := b.calibrate(ctx)
	if err != nil {
		return rep, err
	}
	code := throughputCode(n)
	start := time.Now()
	if _, _, err := timeCommand(b.native(ctx, []string{"python3", "-c", code})); err != nil {
		return rep, err
	}
	rep.SnippetNativeS = time.Since(start).Seconds()

	codes := make([]batchItem, rep.Snippets)
	for i := range codes {
		codes[i].Code = code
	}
	data, _ := json.Marshal(batchInput{Language: wire.LanguagePython, Timeout: 300, Codes: codes})
	file := filepath.Join(b.dir, "throughput.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return rep, err
	}
	for _, run := range []struct {
		parallel string // "": the default
		dst      *float64
	}{{"1", &rep.SerialS}, {"", &rep.ParallelS}} {
		args := []string{"run", "--batch", file, "--image", b.ref}
		if run.parallel != "" {
			args = append(args, "--parallel", run.parallel)
		}
		b.logf("batch throughput: %d snippets of %d iterations, --parallel %s", rep.Snippets, n, cmp.Or(run.parallel, "default"))
		cmd := b.flmbox(ctx, args...)
		d, out, err := timeCommand(cmd)
		if err != nil {
			return rep, err
		}
		var res []batchResult
		if err := json.Unmarshal(out, &res); err != nil {
			return rep, fmt.Errorf("check the output of %s: %w", commandLine(cmd), err)
		}
		if len(res) != rep.Snippets {
			return rep, fmt.Errorf("check the output of %s: %d results, want %d", commandLine(cmd), len(res), rep.Snippets)
		}
		for i, r := range res {
			if r.ExitCode != 0 || r.Stdout != throughputWant(n) {
				return rep, fmt.Errorf("check the result of snippet %d of the batch: exit %d, stdout %q, stderr %q", i, r.ExitCode, r.Stdout, r.Stderr)
			}
		}
		*run.dst = d.Seconds()
	}
	return rep, nil
}

// calibrate returns the iterations of the throughput snippet that take
// about batchSnippetSeconds under chroot on this machine.
func (b *bench) calibrate(ctx context.Context) (int64, error) {
	_, out, err := timeCommand(b.native(ctx, []string{"python3", "-c", calibrationCode}))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return 0, fmt.Errorf("calibrate the throughput snippet: unexpected output %q", out)
	}
	n, err1 := strconv.ParseInt(f[0], 10, 64)
	d, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || n <= 0 || d <= 0 {
		return 0, fmt.Errorf("calibrate the throughput snippet: unexpected output %q", out)
	}
	return int64(float64(n) * batchSnippetSeconds / d), nil
}
