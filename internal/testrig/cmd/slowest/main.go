// Command slowest reads `go test -json` on stdin, prints what go test would
// have printed without -json and -v, and then the slowest top-level tests.
//
// Usage:
//
//	set -o pipefail; go test -json ./... | slowest [-n 15]
//
// A package's own lines pass through as they come (its "ok" or "FAIL", what
// TestMain prints), but for the bare "PASS" line go test -v adds; a test's
// lines (its logs, its subtests') are held until the top-level test ends, and
// printed only if it failed or never ended (a test binary that panicked or
// timed out). Lines that are not JSON pass through unchanged. At the end it
// prints the n slowest top-level tests of all packages, each with its
// package's last path element, and exits 1 if a test or package failed, 0
// otherwise: the pipeline's status (pipefail) carries go test's own as well.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail
	Test       string
	Elapsed    float64
	Output     string
}

// test is a top-level test: its lines while it runs, its time once it ends.
type test struct {
	pkg, name string
	lines     []string
	ended     bool
	elapsed   float64
}

func main() {
	n := flag.Int("n", 15, "how many of the slowest tests to print")
	flag.Parse()
	failed, err := run(os.Stdin, os.Stdout, *n)
	if err != nil {
		fmt.Fprintf(os.Stderr, "slowest: %v\n", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// run copies r's events to w as go test prints them and then the n slowest
// tests; failed reports whether a test, a package or a build failed.
func run(r io.Reader, w io.Writer, n int) (failed bool, err error) {
	tests := map[string]*test{} // by package and top-level name
	var order []*test
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		switch ev.Action {
		case "build-output":
			fmt.Fprint(w, ev.Output)
			continue
		case "build-fail":
			failed = true
			continue
		}
		if ev.Test == "" {
			if ev.Action == "output" && ev.Output != "PASS\n" && !strings.HasPrefix(ev.Output, "=== ") {
				fmt.Fprint(w, ev.Output)
			}
			if ev.Action == "fail" {
				failed = true
			}
			continue
		}
		top, _, sub := strings.Cut(ev.Test, "/")
		key := ev.Package + "\x00" + top
		tt := tests[key]
		if tt == nil {
			tt = &test{pkg: ev.Package, name: top}
			tests[key] = tt
			order = append(order, tt)
		}
		switch ev.Action {
		case "output":
			if !strings.HasPrefix(ev.Output, "=== ") {
				tt.lines = append(tt.lines, ev.Output)
			}
		case "pass", "skip", "fail":
			if ev.Action == "fail" {
				failed = true
			}
			if sub {
				continue
			}
			tt.ended, tt.elapsed = true, ev.Elapsed
			if ev.Action == "fail" {
				fmt.Fprint(w, strings.Join(tt.lines, ""))
			}
			tt.lines = nil
		}
	}
	if err := sc.Err(); err != nil {
		return true, fmt.Errorf("read go test's output: %w", err)
	}
	for _, tt := range order {
		if !tt.ended && len(tt.lines) > 0 {
			failed = true
			fmt.Fprintf(w, "--- %s did not end:\n%s", tt.name, strings.Join(tt.lines, ""))
		}
	}
	var ended []*test
	for _, tt := range order {
		if tt.ended {
			ended = append(ended, tt)
		}
	}
	slices.SortStableFunc(ended, func(a, b *test) int { return cmp.Compare(b.elapsed, a.elapsed) })
	if len(ended) > 0 {
		fmt.Fprintln(w, "slowest tests:")
	}
	for _, tt := range ended[:min(n, len(ended))] {
		fmt.Fprintf(w, "%8.1fs  %s (%s)\n", tt.elapsed, tt.name, path.Base(tt.pkg))
	}
	return failed, nil
}
