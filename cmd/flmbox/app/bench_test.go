package app

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestBenchArgs: flmbox bench's command line goes to flmbox-bench as it was
// written (flags after arguments not moved, --help not taken), after the
// global flags that are set, from the command line or the environment.
func TestBenchArgs(t *testing.T) {
	t.Setenv("FLMBOX_RUNSC", "/opt/runsc")
	for _, tc := range []struct {
		args, want []string
	}{
		{[]string{"bench", "--quick", "--image", "X"}, []string{"--runsc=/opt/runsc", "bench", "--quick", "--image", "X"}},
		{[]string{"--root", "/r", "--debug", "bench", "--help"}, []string{"--root=/r", "--runsc=/opt/runsc", "--debug=true", "bench", "--help"}},
		{[]string{"--runsc", "/bin/runsc", "bench", "IMAGE", "--json"}, []string{"--runsc=/bin/runsc", "bench", "IMAGE", "--json"}},
		{[]string{"bench", "--", "-x"}, []string{"--runsc=/opt/runsc", "bench", "--", "-x"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			a := newApp(nil, &bytes.Buffer{}, &bytes.Buffer{})
			var got []string
			i := slices.IndexFunc(a.Commands, func(c *cli.Command) bool { return c.Name == "bench" })
			a.Commands[i].Action = func(c *cli.Context) error { got = benchArgs(c, "B"); return nil }
			var stderr bytes.Buffer
			if code := runWith(t.Context(), a, append([]string{"flmbox"}, tc.args...), &stderr); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, stderr.String())
			}
			if want := append([]string{"B"}, tc.want...); !slices.Equal(got, want) {
				t.Fatalf("flmbox-bench %q, want %q", got, want)
			}
		})
	}
}

// TestBenchNeedsFlmboxBench: without flmbox-bench next to flmbox-core,
// flmbox bench says what is missing and how to install it, exit 125, and
// execs nothing.
func TestBenchNeedsFlmboxBench(t *testing.T) {
	execBinary = func(string, []string, []string) error { t.Fatal("exec without flmbox-bench"); return nil }
	t.Cleanup(func() { execBinary = defaultExec })
	var stdout, stderr bytes.Buffer
	code := Run(t.Context(), []string{"flmbox", "--root", t.TempDir(), "bench", "--quick"}, &stdout, &stderr)
	if code != exitFlmboxFailed || !strings.Contains(stderr.String(), "flmbox: run flmbox-bench: ") ||
		!strings.Contains(stderr.String(), "flmbox: install flmbox, flmbox-core, flmbox-bench and flmbox-agent") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}
