package stateroot

import "testing"

func TestLayout(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Sandboxes("/r"), "/r/sandboxes"},
		{Sandbox("/r", "sb-1"), "/r/sandboxes/sb-1"},
		{Sandbox("/r/", ".new-1"), "/r/sandboxes/.new-1"},
		{Images("/r"), "/r/images"},
		{Pipcache("/r"), "/r/pipcache"},
		{Runsc("/r"), "/r/runsc"},
		{Pool("/r"), "/r/pool"},
		{Agents("/r"), "/r/agents"},
		{Logs("r"), "r/logs"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
