package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/snippet/wire"
)

func TestParsePooledCall(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	def := func(edit func(w *warmCall)) *warmCall {
		w := &warmCall{root: runcmd.DefaultRoot, image: "img@sha256:1", language: wire.LanguagePython, timeout: 30 * time.Second,
			maxOutput: wire.DefaultMaxOutput, code: "print(1)", hasCode: true}
		edit(w)
		return w
	}
	for _, tc := range []struct {
		name, args string
		want       *warmCall // nil: handed to flmbox-core
	}{
		{"plain", "run --image img@sha256:1 -c print(1)", def(func(*warmCall) {})},
		{"its /tmp's size, as given", "run --image=img@sha256:1 --tmp-size 64MiB -c print(1)", def(func(w *warmCall) { w.tmpSize = "64MiB" })},
		{"runsc passed on, and the run flags", "--root /r --runsc /x run --image img@sha256:1 -l shell --timeout 2s --json -e K=V -c print(1)",
			def(func(w *warmCall) {
				w.root, w.runsc, w.language, w.timeout, w.json, w.env = "/r", "/x", "shell", 2*time.Second, true, []string{"K=V"}
			})},
		{"a file", "run --image img@sha256:1 code.py", def(func(w *warmCall) { w.code, w.hasCode, w.file = "", false, "code.py" })},
		{"a warm call", "run --sandbox sb -c print(1)", nil},
		{"both", "run --sandbox sb --image img@sha256:1 -c print(1)", nil},
		{"--reset (refused)", "run --image img@sha256:1 --reset -c print(1)", nil},
		{"another sandbox flag", "run --image img@sha256:1 --memory 1GiB -c print(1)", nil},
		{"a copy", "run --image img@sha256:1 --copy a:/tmp/a -c print(1)", nil},
		{"a batch", "run --image img@sha256:1 --batch b.json", nil},
		{"a callback", "run --image img@sha256:1 --callback /s -c print(1)", nil},
		{"debug", "--debug run --image img@sha256:1 -c print(1)", nil},
		{"code on stdin", "run --image img@sha256:1 -", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parsePooledCall(strings.Fields(tc.args), none)
			if tc.want == nil {
				if ok {
					t.Fatalf("parsed %+v, want it handed to flmbox-core", got)
				}
				return
			}
			if !ok || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v (%v), want %+v", got, ok, tc.want)
			}
		})
	}
}

func TestGiveBackArgs(t *testing.T) {
	w := &warmCall{root: "/r", runsc: "/x"}
	for _, tc := range []struct {
		back giveBack
		want string
	}{
		{giveBack{name: "pool-1"}, "flmbox-core --root /r --runsc /x pool return --status 0 -- pool-1"},
		{giveBack{name: "pool-1", status: 124, message: "timed out", quiet: false}, "flmbox-core --root /r --runsc /x pool return --status 124 --message timed out -- pool-1"},
		{giveBack{name: "pool-1", status: 130, quiet: true}, "flmbox-core --root /r --runsc /x pool return --status 130 --quiet -- pool-1"},
	} {
		if got := strings.Join(w.giveBackArgs(tc.back), " "); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
