package names

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"a", true}, {"demo-1_x.y", true}, {"9lives", true}, {strings.Repeat("a", 16), true},
		{strings.Repeat("a", 17), false}, {"", false}, {"-a", false}, {".hidden", false}, {"_a", false},
		{"..", false}, {"a/b", false}, {"a b", false}, {"a\x00", false}, {"é", false},
	} {
		if got := Valid(tc.s, 16); got != tc.ok {
			t.Errorf("Valid(%q, 16) = %v, want %v", tc.s, got, tc.ok)
		}
	}
}
