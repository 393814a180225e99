package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// TestPlanBudget: which sandboxes GC's budget suspends, given each one's
// last use, whether GC may suspend it, whether it is in a call, and its
// memory.
func TestPlanBudget(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	const mib = 1 << 20
	// sb is a sandbox used at minute min, of mem MiB; flags: "h" held
	// (pooled or owned: never suspended), "c" in a call, "s" suspended
	// already.
	sb := func(name string, min int, mem int64, flags string) budgetSandbox {
		return budgetSandbox{Name: name, LastUsed: t0.Add(time.Duration(min) * time.Minute), Memory: mem * mib,
			Eligible: !strings.Contains(flags, "h"), InCall: strings.Contains(flags, "c"), Suspended: strings.Contains(flags, "s")}
	}
	n := func(v int) *int { return &v }
	bytes := func(v int64) *int64 { return &v }
	four := []budgetSandbox{sb("d", 4, 20, ""), sb("a", 1, 20, ""), sb("c", 3, 20, ""), sb("b", 2, 20, "")}
	for _, tc := range []struct {
		name          string
		cands         []budgetSandbox
		b             gcBudget
		suspend, skip []string
		met           bool
	}{
		{"no budget", four, gcBudget{}, nil, nil, true},
		{"under --max-running", four, gcBudget{maxRunning: n(4)}, nil, nil, true},
		{"--max-running 2: the two least recently used", four, gcBudget{maxRunning: n(2)}, []string{"a", "b"}, nil, true},
		{"--max-running 0: all", four, gcBudget{maxRunning: n(0)}, []string{"a", "b", "c", "d"}, nil, true},
		{"one in a call is skipped for the next", []budgetSandbox{sb("a", 1, 20, "c"), sb("b", 2, 20, ""), sb("c", 3, 20, ""), sb("d", 4, 20, "")},
			gcBudget{maxRunning: n(2)}, []string{"b", "c"}, []string{"a"}, true},
		{"a call in one used after those suspended is not skipped", []budgetSandbox{sb("a", 1, 20, ""), sb("b", 2, 20, ""), sb("c", 3, 20, "c"), sb("d", 4, 20, "")},
			gcBudget{maxRunning: n(2)}, []string{"a", "b"}, nil, true},
		{"held ones count, never suspended", []budgetSandbox{sb("pool", 0, 20, "h"), sb("a", 1, 20, ""), sb("b", 2, 20, ""), sb("owned", 3, 20, "h")},
			gcBudget{maxRunning: n(2)}, []string{"a", "b"}, nil, true},
		{"not met: held and in calls", []budgetSandbox{sb("pool", 0, 20, "h"), sb("a", 1, 20, "c"), sb("b", 2, 20, ""), sb("c", 3, 20, "c")},
			gcBudget{maxRunning: n(1)}, []string{"b"}, []string{"a", "c"}, false},
		{"suspended ones do not count", []budgetSandbox{sb("a", 1, 20, "s"), sb("b", 2, 20, ""), sb("c", 3, 20, "")},
			gcBudget{maxRunning: n(1)}, []string{"b"}, nil, true},
		{"--max-memory: least recently used until under", []budgetSandbox{sb("a", 1, 10, ""), sb("b", 2, 50, ""), sb("c", 3, 30, ""), sb("d", 4, 30, "")},
			gcBudget{maxMemory: bytes(70 * mib)}, []string{"a", "b"}, nil, true},
		{"--max-memory: exactly at the budget is met", []budgetSandbox{sb("a", 1, 10, ""), sb("b", 2, 50, "")},
			gcBudget{maxMemory: bytes(60 * mib)}, nil, nil, true},
		{"--max-memory not met: a big one held", []budgetSandbox{sb("a", 1, 10, ""), sb("big", 2, 500, "h")},
			gcBudget{maxMemory: bytes(100 * mib)}, []string{"a"}, nil, false},
		{"both rules: the stricter decides", four, gcBudget{maxRunning: n(3), maxMemory: bytes(40 * mib)}, []string{"a", "b"}, nil, true},
		{"same last use: by name", []budgetSandbox{sb("y", 1, 1, ""), sb("x", 1, 1, ""), sb("z", 1, 1, "")},
			gcBudget{maxRunning: n(1)}, []string{"x", "y"}, nil, true},
		{"nothing running", nil, gcBudget{maxRunning: n(0), maxMemory: bytes(0)}, nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.cands)
			suspend, skipped, met := planBudget(tc.cands, tc.b)
			names := func(idx []int) []string {
				var out []string
				for _, i := range idx {
					out = append(out, tc.cands[i].Name)
				}
				return out
			}
			if got := names(suspend); !slices.Equal(got, tc.suspend) {
				t.Errorf("suspend %q, want %q", got, tc.suspend)
			}
			if got := names(skipped); !slices.Equal(got, tc.skip) {
				t.Errorf("skipped %q, want %q", got, tc.skip)
			}
			if met != tc.met {
				t.Errorf("met %v, want %v", met, tc.met)
			}
			if !slices.Equal(before, tc.cands) {
				t.Errorf("planBudget changed its input")
			}
		})
	}
}

func TestBudgetError(t *testing.T) {
	two, mib64 := 2, int64(64<<20)
	err := error(&BudgetError{Running: 4, MemoryBytes: 100 << 20, MaxRunning: &two, MaxMemory: &mib64, InCall: []string{"a"}, Held: 2, Failed: 1})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a BudgetError is not errdefs.ErrUnavailable")
	}
	msg := err.Error()
	for _, want := range []string{"is not met", "4 sandboxes run (at most 2 wanted)", "100MiB (at most 64MiB wanted)", "1 in a call (a)", "2 pooled", "1 failed"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("%q: not one line", msg)
	}
}

// TestGCRefusesBadValues: a negative option is an invalid argument, and
// nothing is read or done.
func TestGCRefusesBadValues(t *testing.T) {
	m, err := Open(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	neg, negBytes := -1, int64(-1)
	for _, o := range []GCOptions{{SuspendIdle: -time.Second}, {RemoveIdle: -time.Second}, {MaxRunning: &neg}, {MaxMemory: &negBytes}} {
		acts, err := m.GC(context.Background(), o)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || len(acts) != 0 || strings.Contains(err.Error(), "\n") {
			t.Errorf("GC(%s) = %v, %v; want one line of invalid argument", fmt.Sprintf("%+v", o), acts, err)
		}
	}
}
