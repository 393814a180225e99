//go:build integration

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCpManyCopies: copies one after another, each way, interleaved with
// calls, all succeed: the agent's reaper of orphans must never reap a copy's
// helper before the copy waits for it ("waitid: no child processes").
func TestCpManyCopies(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, []byte("f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const n = 15
	var failed []string
	for i := range n {
		for _, args := range [][]string{{f, fmt.Sprintf("s:/tmp/f%d", i)}, {fmt.Sprintf("s:/tmp/f%d", i), "-"}} {
			if res := cp(t, root, nil, args...); res.code != 0 {
				failed = append(failed, fmt.Sprintf("cp %s %s: exit %d: %s", args[0], args[1], res.code, strings.TrimSpace(res.stderr)))
			}
		}
		if i%5 == 0 {
			shell(t, root, "s", "true")
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d copies failed:\n%s", len(failed), 2*n, strings.Join(failed, "\n"))
	}
	if out := shell(t, root, "s", "cat /tmp/f* | wc -l"); out != fmt.Sprintf("%d\n", n) && len(failed) == 0 {
		t.Errorf("%s lines in the copies, want %d", out, n)
	}
}
