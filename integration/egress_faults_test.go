//go:build integration

package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/testrig/networld"
)

// TestEgressCreateKilled: an egress sandbox's create SIGKILLed when runsc
// starts (its network, table and resolver made) or after runsc made the
// container leaves what the next command's Reconcile removes whole: the
// worker's links, routes, nftables tables, namespaces, mounts and
// processes are as before, and its forwarding is off again.
func TestEgressCreateKilled(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	w := networld.Start(t)
	before, err := w.WorkerState()
	if err != nil {
		t.Fatal(err)
	}
	for _, when := range []string{"before", "after"} {
		name := "killed-" + when
		args := []string{"sandbox", "create", "--name", name, "--image", reg.digestRef(), "--network", "egress",
			"--allow", "allowed.test", "--dns", networld.DNSAddr}
		cmd := w.Command(context.Background(), flmboxBin, append([]string{"--root", root, "--runsc", hookedRunsc(t)}, args...)...)
		killCmdAt(t, killPoint{verb: "run", when: when}, cmd, args)
		mid, err := w.WorkerState()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(mid.String(), "flmbox-resolver") || !strings.Contains(mid.String(), "inet flmbox-") {
			t.Fatalf("killed %s runsc run: no resolver or table to clean up, the test kills too early:\n%s", when, mid)
		}
		out := mustFlmboxIn(t, w, root, "sandbox", "ls", "--json")
		if strings.Contains(out, name) {
			t.Fatalf("sandbox ls after a killed create lists it: %s", out)
		}
		var after networld.State
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if after, err = w.WorkerState(); err != nil {
				t.Fatal(err)
			}
			if after.String() == before.String() || time.Now().After(deadline) {
				break
			}
		}
		if after.String() != before.String() {
			t.Fatalf("a create killed %s runsc run left, after Reconcile:\n%s\nbefore:\n%s", when, after, before)
		}
	}
}
