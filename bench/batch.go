package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

// batchInput is `flmbox run --batch`'s input, as the bench writes it:
// codes share the batch's language and timeout (seconds; 0: the CLI's
// default).
type batchInput struct {
	Language string      `json:"language"`
	Timeout  float64     `json:"timeout,omitempty"`
	Codes    []batchItem `json:"codes"`
}

// batchItem is one code of a batchInput.
type batchItem struct {
	Code string `json:"code"`
}

// batchResult is one element of `flmbox run --batch`'s output array.
type batchResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// writeBatch writes a batch of codes in language to file.
func writeBatch(file, language string, timeout float64, codes ...string) error {
	in := batchInput{Language: language, Timeout: timeout}
	for _, c := range codes {
		in.Codes = append(in.Codes, batchItem{Code: c})
	}
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o600)
}

// readBatchOutput parses the output of `flmbox run --batch` cmd, which
// must hold n results.
func readBatchOutput(cmd *exec.Cmd, out []byte, n int) ([]batchResult, error) {
	var res []batchResult
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("check the output of %s: %w: %q", commandLine(cmd), err, out)
	}
	if len(res) != n {
		return nil, fmt.Errorf("check the output of %s: %d results, want %d", commandLine(cmd), len(res), n)
	}
	return res, nil
}

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
func (r *runner) measureBatch(ctx context.Context) (Batch, error) {
	rep := Batch{Snippets: r.opts.BatchSnippets, Parallel: goruntime.NumCPU()}
	n, err := r.calibrate(ctx)
	if err != nil {
		return rep, err
	}
	code := throughputCode(n)
	start := time.Now()
	if _, _, err := timeCommand(r.native(ctx, []string{"python3", "-c", code})); err != nil {
		return rep, err
	}
	rep.SnippetNativeS = time.Since(start).Seconds()

	codes := make([]string, rep.Snippets)
	for i := range codes {
		codes[i] = code
	}
	file := filepath.Join(r.dir, "throughput.json")
	if err := writeBatch(file, sandbox.Python, 300, codes...); err != nil {
		return rep, err
	}
	for _, run := range []struct {
		parallel string // "": the default
		dst      *float64
	}{{"1", &rep.SerialS}, {"", &rep.ParallelS}} {
		args := []string{"run", "--batch", file, "--image", r.ref}
		if run.parallel != "" {
			args = append(args, "--parallel", run.parallel)
		}
		r.logf("batch throughput: %d snippets of %d iterations, --parallel %s", rep.Snippets, n, cmp.Or(run.parallel, "default"))
		cmd := r.flmbox(ctx, args...)
		d, out, err := timeCommand(cmd)
		if err != nil {
			return rep, err
		}
		res, err := readBatchOutput(cmd, out, rep.Snippets)
		if err != nil {
			return rep, err
		}
		for i, x := range res {
			if x.ExitCode != 0 || x.Stdout != throughputWant(n) {
				return rep, fmt.Errorf("check the result of snippet %d of the batch: exit %d, stdout %q, stderr %q", i, x.ExitCode, x.Stdout, x.Stderr)
			}
		}
		*run.dst = d.Seconds()
	}
	return rep, nil
}

// calibrate returns the iterations of the throughput snippet that take
// about batchSnippetSeconds under chroot on this machine.
func (r *runner) calibrate(ctx context.Context) (int64, error) {
	_, out, err := timeCommand(r.native(ctx, []string{"python3", "-c", calibrationCode}))
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
