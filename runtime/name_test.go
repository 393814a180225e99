package runtime

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"demo-1_x.y", true},
		{"9lives", true},
		{strings.Repeat("a", 64), true},
		{strings.Repeat("a", 65), false},
		{"", false},
		{"-a", false},
		{".hidden", false},
		{"_a", false},
		{"..", false},
		{"a/b", false},
		{"a b", false},
		{"a\x00", false},
		{"é", false},
	} {
		err := ValidateName(tc.name)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
