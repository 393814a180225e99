package privilege

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestCheck: without root, or without CAP_SYS_ADMIN, the first words say
// what flmbox needs.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		euid int
		caps uint64
		want string
	}{
		{0, ^uint64(0), ""},
		{1000, ^uint64(0), `create sandbox "x": flmbox needs root`},
		{1000, 0, `create sandbox "x": flmbox needs root`},
		{0, ^uint64(0) &^ (1 << capSysAdmin), `create sandbox "x": flmbox needs root with CAP_SYS_ADMIN`},
	} {
		err := check(`create sandbox "x"`, tc.euid, tc.caps)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("euid %d caps %x: %v", tc.euid, tc.caps, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errdefs.IsPermissionDenied(err)):
			t.Errorf("euid %d caps %x: %v, want %q, permission denied", tc.euid, tc.caps, err, tc.want)
		}
	}
}

// TestCapsIn: CapEff is read as hex; a status that cannot be read, or has
// no CapEff line, counts as every capability, so that the operation itself
// says what fails.
func TestCapsIn(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, status string
		want         uint64
	}{
		{"sysadmin", "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000200000\nCapBnd:\t000001ffffffffff\n", 1 << capSysAdmin},
		{"none", "CapEff:\t0000000000000000\n", 0},
		{"no CapEff", "Name:\tx\n", ^uint64(0)},
		{"garbled", "CapEff:\tzz\n", ^uint64(0)},
		{"unreadable", "", ^uint64(0)},
	} {
		p := filepath.Join(dir, "missing")
		if tc.status != "" {
			p = filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(p, []byte(tc.status), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if got := capsIn(p); got != tc.want {
			t.Errorf("%s: capsIn = %x, want %x", tc.name, got, tc.want)
		}
	}
}
