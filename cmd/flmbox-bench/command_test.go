package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/bench"
	"github.com/flmbox/flmbox/cmd/flmbox/app"
)

// parseBench runs `flmbox bench ARGS` with an action that only reads the
// options.
func parseBench(t *testing.T, args ...string) (bench.Options, error) {
	t.Helper()
	cmd := benchCommand()
	var o bench.Options
	var err error
	cmd.Action = func(c *cli.Context) error {
		o, err = benchOptionsFrom(c)
		return nil
	}
	a := &cli.App{Commands: []*cli.Command{cmd}, Writer: &bytes.Buffer{}, ErrWriter: &bytes.Buffer{}}
	if rerr := a.Run(append([]string{"flmbox", "bench"}, args...)); rerr != nil {
		return o, rerr
	}
	return o, err
}

func TestBenchOptions(t *testing.T) {
	full, quick := bench.Defaults(false), bench.Defaults(true)
	with := func(o bench.Options, edit func(*bench.Options)) bench.Options { edit(&o); return o }
	for _, tc := range []struct {
		args []string
		want bench.Options
		err  string
	}{
		{args: nil, want: full},
		{args: []string{"--quick", "--json"}, want: quick},
		{args: []string{"--quick", "--calls", "7", "--warmup", "0", "--image", "oci-layout:/x"},
			want: with(quick, func(o *bench.Options) { o.Image, o.Calls, o.Warmup = "oci-layout:/x", 7, 0 })},
		{args: []string{"--pairs", "1", "--rounds", "1", "--calls", "1"},
			want: with(full, func(o *bench.Options) { o.Pairs, o.Rounds, o.Calls = 1, 1, 1 })},
		{args: []string{"--quick", "--pause", "20ms"}, want: with(quick, func(o *bench.Options) { o.Pause = 20 * time.Millisecond })},
		{args: []string{"--calls", "many"}, err: "invalid value"},
		{args: []string{"--quick", "--density", "500"}, want: with(quick, func(o *bench.Options) { o.Density = 500 })},
		{args: []string{"--density", "50", "--density-suspended", "2000", "--density-only"},
			want: with(full, func(o *bench.Options) { o.Density, o.DensitySuspended, o.DensityOnly = 50, 2000, true })},
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
			if got.Pairs != tc.want.Pairs || got.Warmup != tc.want.Warmup || got.Rounds != tc.want.Rounds || got.Calls != tc.want.Calls ||
				got.Pause != tc.want.Pause || got.Image != tc.want.Image || got.PrewarmRounds != tc.want.PrewarmRounds ||
				got.BatchSnippets != tc.want.BatchSnippets || got.Idle != tc.want.Idle || got.Flmbox == "" ||
				got.Density != tc.want.Density || got.DensitySuspended != tc.want.DensitySuspended || got.DensityOnly != tc.want.DensityOnly {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBenchRefusesArguments(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := app.RunCommand(t.Context(), []string{"flmbox-bench", "--root", t.TempDir(), "bench", "IMAGE"}, &stdout, &stderr, benchCommand())
	if code != exitFlmboxFailed || !strings.Contains(stderr.String(), "--image") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

// TestBenchRefusesBadCounts: bench.Run checks the counts before anything
// else; the CLI prints its error.
func TestBenchRefusesBadCounts(t *testing.T) {
	for _, args := range [][]string{{"--pairs", "0"}, {"--rounds", "-1"}, {"--calls", "100000"}, {"--pause", "2s"}, {"--density", "-1"}} {
		var stdout, stderr bytes.Buffer
		code := app.RunCommand(t.Context(), append([]string{"flmbox-bench", "--root", t.TempDir(), "bench", "--image", "oci-layout:/x"}, args...), &stdout, &stderr, benchCommand())
		if code != exitFlmboxFailed || !strings.Contains(stderr.String(), strings.TrimPrefix(args[0], "--")+" "+args[1]) {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

// exitFlmboxFailed is the exit status when flmbox itself failed.
const exitFlmboxFailed = 125

// TestBenchUsageErrors: a bench command line that does not parse is said
// in one line that names the flag, exit 125, as flmbox-core says its own.
func TestBenchUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pause", "x"}, "--pause x: want 0 or a duration such as 30s"},
		{[]string{"--pairs", "many"}, "--pairs many: want a whole number"},
		{[]string{"--bogus"}, "flag provided but not defined: --bogus; flmbox bench --help lists the flags"},
	} {
		var stdout, stderr bytes.Buffer
		code := app.RunCommand(t.Context(), append([]string{"flmbox-bench", "--root", t.TempDir(), "bench"}, tc.args...), &stdout, &stderr, benchCommand())
		if code != exitFlmboxFailed || stderr.String() != "flmbox: "+tc.want+"\n" || stdout.Len() != 0 {
			t.Errorf("bench %s: exit %d\nstdout %q\nstderr %q\nwant   %q", strings.Join(tc.args, " "), code, stdout.String(), stderr.String(), "flmbox: "+tc.want+"\n")
		}
	}
}

// TestBenchHelp: flmbox bench --help, which flmbox-core hands to
// flmbox-bench, describes the bench and its flags under the name users type.
func TestBenchHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := app.RunCommand(t.Context(), []string{"flmbox-bench", "bench", "--help"}, &stdout, &stderr, benchCommand())
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{"flmbox bench - " + app.BenchUsage, "in-process registry", "--quick", "--pause", "--image",
		"--density N", "--density-suspended", "--density-only"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("help without %q:\n%s", want, stdout.String())
		}
	}
}
