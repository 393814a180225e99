package errkind

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"
)

func TestSentinelsMatchTheirKindAndOnlyThemselves(t *testing.T) {
	a, b := New(errdefs.ErrNotFound, "gone"), New(errdefs.ErrNotFound, "gone")
	err := fmt.Errorf("sandbox %q: %w", "x", a)
	if !errors.Is(err, a) || !errdefs.IsNotFound(err) {
		t.Errorf("%v does not match its sentinel and kind", err)
	}
	if errors.Is(err, b) || errdefs.IsUnavailable(err) {
		t.Errorf("%v matches another sentinel or kind", err)
	}
	if err.Error() != `sandbox "x": gone` {
		t.Errorf("text %q", err.Error())
	}
}
