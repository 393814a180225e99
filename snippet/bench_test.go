package snippet

import (
	"bytes"
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// BenchmarkOverhead compares, in one run and interleaved, a bare spawn of
// python3 -c "print(1)" and sh -c "echo 1" with Agent.Run and with Call
// through Serve of the same snippets, and reports the median of each in
// milliseconds. Run it with -benchtime=20x for the median of 20 calls.
func BenchmarkOverhead(b *testing.B) {
	python := hostPython(b)
	a := &Agent{Python: python, Dir: b.TempDir()}
	socket := serve(b, a)
	ctx := context.Background()
	bare := func(path string, args ...string) func() error {
		return func() error {
			var out bytes.Buffer
			cmd := exec.Command(path, args...)
			cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &out, a.Dir
			return cmd.Run()
		}
	}
	viaRun := func(req *wire.Request) func() error {
		return func() error {
			if res := a.Run(ctx, req); res.ExitCode != 0 || string(res.Stdout.Data) != "1\n" {
				b.Fatalf("Run: %s", dump(res))
			}
			return nil
		}
	}
	viaCall := func(req *wire.Request) func() error {
		return func() error {
			res, err := wire.Call(ctx, socket, req)
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("Call: %v", err)
			}
			return nil
		}
	}
	py, sh := request(wire.LanguagePython, "print(1)"), request(wire.LanguageShell, "echo 1")
	variants := []struct {
		name string
		f    func() error
	}{
		{"python-bare-ms", bare(python, "-c", "print(1)")},
		{"python-run-ms", viaRun(py)},
		{"python-call-ms", viaCall(py)},
		{"shell-bare-ms", bare("/bin/sh", "-c", "echo 1")},
		{"shell-run-ms", viaRun(sh)},
		{"shell-call-ms", viaCall(sh)},
	}
	times := make([][]float64, len(variants))
	for b.Loop() {
		for i, v := range variants {
			start := time.Now()
			if err := v.f(); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			times[i] = append(times[i], float64(time.Since(start).Microseconds())/1000)
		}
	}
	for i, v := range variants {
		slices.Sort(times[i])
		b.ReportMetric(times[i][len(times[i])/2], v.name)
	}
	b.ReportMetric(0, "ns/op")
}
