package app

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
)

func TestHoistFlags(t *testing.T) {
	app := newApp(nil, nil, nil)
	for _, tc := range []struct{ in, want string }{
		{"flmbox prewarm IMG --json", "flmbox prewarm --json IMG"},
		{"flmbox prewarm IMG --platform linux/arm64 --json", "flmbox prewarm --platform linux/arm64 --json IMG"},
		{"flmbox --root /r prewarm IMG --platform=linux/arm64", "flmbox --root /r prewarm --platform=linux/arm64 IMG"},
		{"flmbox images gc --max-bytes 1GiB", "flmbox images gc --max-bytes 1GiB"},
		{"flmbox images rm A B --debug", "flmbox images rm --debug A B"},
		{"flmbox images ls --json", "flmbox images ls --json"},
		{"flmbox prewarm -- --weird", "flmbox prewarm -- --weird"},
		{"flmbox unknown IMG --json", "flmbox unknown IMG --json"},
		// A flag without its value does not take the argument before it.
		{"flmbox prewarm IMG --platform", "flmbox prewarm --platform"},
	} {
		got := strings.Join(runcmd.HoistFlags(app, strings.Fields(tc.in)), " ")
		if got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFlagsAfterImage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := Run(t.Context(), []string{"flmbox", "--root", t.TempDir(), "prewarm", "oci-layout:/nonexistent", "--offline", "--json"}, &stdout, &stderr)
	if code != 125 || !strings.Contains(stderr.String(), "never resolved") {
		t.Fatalf("exit %d, stderr %q: the flags after IMAGE were not read", code, stderr.String())
	}
	if !slices.Equal(strings.Fields(stdout.String()), nil) {
		t.Fatalf("stdout %q", stdout.String())
	}
}
