package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestDefaults(t *testing.T) {
	full := Options{Pairs: 12, Warmup: 5, Rounds: 6, Calls: 50, PrewarmRounds: 5, BatchSnippets: 64, CallbackTrips: 200,
		EgressDownloads: 5, EgressConnects: 200, Idle: 2 * time.Second}
	quick := Options{Pairs: 3, Warmup: 2, Rounds: 2, Calls: 10, PrewarmRounds: 2, BatchSnippets: 16, CallbackTrips: 50,
		EgressDownloads: 1, EgressConnects: 50, Idle: time.Second}
	for _, tc := range []struct {
		quick bool
		want  Options
	}{{false, full}, {true, quick}} {
		got := Defaults(tc.quick)
		if got.Pairs != tc.want.Pairs || got.Warmup != tc.want.Warmup || got.Rounds != tc.want.Rounds || got.Calls != tc.want.Calls ||
			got.PrewarmRounds != tc.want.PrewarmRounds || got.BatchSnippets != tc.want.BatchSnippets || got.Idle != tc.want.Idle ||
			got.CallbackTrips != tc.want.CallbackTrips || got.EgressDownloads != tc.want.EgressDownloads || got.EgressConnects != tc.want.EgressConnects ||
			got.Pause != 0 || got.Root != "" || got.Flmbox != "" || got.Image != "" || got.Progress != nil || got.Warnf != nil {
			t.Errorf("Defaults(%t) = %+v, want %+v", tc.quick, got, tc.want)
		}
		got.Root, got.Flmbox = "/r", "/bin/flmbox"
		if err := got.validate(); err != nil {
			t.Errorf("Defaults(%t): %v", tc.quick, err)
		}
	}
}

func TestValidate(t *testing.T) {
	valid := func(change func(*Options)) Options {
		o := Defaults(true)
		o.Root, o.Flmbox = "/r", "/bin/flmbox"
		change(&o)
		return o
	}
	for _, tc := range []struct {
		name   string
		change func(*Options)
		err    string // "": valid
	}{
		{"quick", func(o *Options) {}, ""},
		{"one of each", func(o *Options) { o.Pairs, o.Rounds, o.Calls, o.Warmup = 1, 1, 1, 0 }, ""},
		{"most", func(o *Options) { o.Pairs, o.Calls, o.BatchSnippets = 10000, 10000, 64 }, ""},
		{"paced", func(o *Options) { o.Pause = 20 * time.Millisecond }, ""},
		{"no root", func(o *Options) { o.Root = "" }, "no state root"},
		{"no flmbox", func(o *Options) { o.Flmbox = "" }, "no flmbox binary"},
		{"no pairs", func(o *Options) { o.Pairs = 0 }, "pairs 0: want 1 to 10000"},
		{"negative rounds", func(o *Options) { o.Rounds = -1 }, "rounds -1"},
		{"no calls", func(o *Options) { o.Calls = 0 }, "calls 0"},
		{"negative warmup", func(o *Options) { o.Warmup = -1 }, "warmup -1"},
		{"too many calls", func(o *Options) { o.Calls = 100000 }, "want 1 to 10000"},
		{"no prewarm rounds", func(o *Options) { o.PrewarmRounds = 0 }, "prewarm rounds 0"},
		{"too large a batch", func(o *Options) { o.BatchSnippets = 65 }, "batch snippets 65: want 1 to 64"},
		{"long pause", func(o *Options) { o.Pause = 2 * time.Second }, "pause 2s"},
		{"negative pause", func(o *Options) { o.Pause = -time.Millisecond }, "pause -1ms"},
		{"negative idle", func(o *Options) { o.Idle = -time.Second }, "idle -1s"},
		{"most callback round trips", func(o *Options) { o.CallbackTrips = 1000 }, ""},
		{"no callback round trips", func(o *Options) { o.CallbackTrips = 0 }, "callback round trips 0: want 1 to 1000"},
		{"too many callback round trips", func(o *Options) { o.CallbackTrips = 1001 }, "callback round trips 1001"},
		{"most egress downloads and connects", func(o *Options) { o.EgressDownloads, o.EgressConnects = 100, 10000 }, ""},
		{"no egress downloads", func(o *Options) { o.EgressDownloads = 0 }, "egress downloads 0: want 1 to 100"},
		{"too many egress connects", func(o *Options) { o.EgressConnects = 10001 }, "egress connects 10001: want 1 to 10000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := valid(tc.change).validate()
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error %v, want an invalid argument with %q", err, tc.err)
			}
		})
	}
}

// TestRunRefuses checks that Run refuses bad options, and a user other
// than root, before it makes anything.
func TestRunRefuses(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	o := Defaults(true)
	o.Root, o.Flmbox, o.Pairs = root, "/nonexistent/flmbox", 0
	if _, err := Run(t.Context(), o); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("pairs 0: %v", err)
	}
	if os.Geteuid() != 0 {
		o.Pairs = 1
		if _, err := Run(t.Context(), o); !errors.Is(err, ErrNotRoot) || !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("not root: %v", err)
		}
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the state root was made: %v", err)
	}
}

func TestPickImage(t *testing.T) {
	root := t.TempDir()
	if got, err := pickImage(t.Context(), root, "oci-layout:/srv/x@sha256:"+strings.Repeat("a", 64)); err != nil || !strings.HasPrefix(got, "oci-layout:") {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := pickImage(t.Context(), root, "oci-layout:/srv/x@sha256:short"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a bad reference: %v", err)
	}
	_, err := pickImage(t.Context(), root, "")
	if !errors.Is(err, ErrNoImage) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "holds 0 images") {
		t.Fatalf("an empty cache: %v", err)
	}
}
