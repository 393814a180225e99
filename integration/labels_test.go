//go:build integration

package integration

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestLabels: sandbox create --label K=V labels a sandbox, sandbox ls
// --filter label=K[=V] finds it again (every filter must hold) and --json
// shows its labels; a bad label is refused in one line before anything is
// made.
func TestLabels(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	mustFlmbox(t, root, "sandbox", "create", "--name", "ml", "--image", reg.digestRef(), "-l", "team=ml", "-l", "run=42")
	mustFlmbox(t, root, "sandbox", "create", "--name", "web", "--image", reg.digestRef(), "--label", "team=web")
	t.Cleanup(func() { flmbox(t, root, "sandbox", "rm", "ml", "web") })
	ls := func(filters ...string) []string {
		t.Helper()
		args := []string{"sandbox", "ls", "--json"}
		for _, f := range filters {
			args = append(args, "--filter", f)
		}
		var infos []struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		}
		out := mustFlmbox(t, root, args...)
		if err := json.Unmarshal([]byte(out), &infos); err != nil {
			t.Fatalf("sandbox ls --json printed %q: %v", out, err)
		}
		var names []string
		for _, i := range infos {
			names = append(names, i.Name)
			if i.Name == "ml" && (i.Labels["team"] != "ml" || i.Labels["run"] != "42" || len(i.Labels) != 2) {
				t.Errorf("ml's labels: %v", i.Labels)
			}
		}
		slices.Sort(names)
		return names
	}
	for filters, want := range map[string][]string{
		"":                         {"ml", "web"},
		"label=team":               {"ml", "web"},
		"label=team=ml":            {"ml"},
		"label=run":                {"ml"},
		"label=team=web label=run": nil,
	} {
		if got := ls(strings.Fields(filters)...); !slices.Equal(got, want) {
			t.Errorf("sandbox ls --filter %q: %v, want %v", filters, got, want)
		}
	}
	for _, bad := range []string{"a b=1", "k=line\nbreak"} {
		r := flmbox(t, root, "sandbox", "create", "--name", "bad", "--image", reg.digestRef(), "--label", bad)
		if r.code != 125 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.Contains(r.stderr, "label") {
			t.Errorf("--label %q: exit %d, stderr %q", bad, r.code, r.stderr)
		}
	}
	if r := flmbox(t, root, "sandbox", "ls", "--filter", "team=ml"); r.code != 125 || !strings.Contains(r.stderr, "label=K") {
		t.Errorf("--filter without label=: exit %d, stderr %q", r.code, r.stderr)
	}
	if got := ls(); !slices.Equal(got, []string{"ml", "web"}) {
		t.Errorf("after the refused creates: %v", got)
	}
}
