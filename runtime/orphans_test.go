package runtime

import "testing"

func TestNamesRoot(t *testing.T) {
	const root = "/var/lib/flmbox/runsc"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"runsc-sandbox", "--root=" + root, "boot", "flmbox-1"}, true},
		{[]string{"runsc-gofer", "--network=none", "--root", root, "gofer", "flmbox-1"}, true},
		{[]string{"runsc-sandbox", "--root=" + root + "x", "boot", "flmbox-1"}, false},
		{[]string{"runsc-sandbox", "--root", "/other", "boot", "flmbox-1"}, false},
		{[]string{"runsc-sandbox", "--root"}, false},
	} {
		if got := namesRoot(tc.args, root); got != tc.want {
			t.Errorf("%q: %t, want %t", tc.args, got, tc.want)
		}
	}
}
