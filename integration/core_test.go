//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	"github.com/flmbox/flmbox/rootfs"
)

// Issue "An embeddable core": what moving sandboxes into package sandbox
// fixed, through the CLI binaries.

// TestBatchOfSilentSnippets: a batch snippet that succeeds without printing
// anything comes back as exit 0 with empty output, in fresh sandboxes
// (--image) and in an existing one (--sandbox); a failing one next to them
// still fails. (flmbox once took an empty result for a snippet that never
// ran, and reported "exit_code -1, flmbox: not run: <nil>".)
func TestBatchOfSilentSnippets(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	mustFlmbox(t, root, "sandbox", "create", "--name", "quiet", "--image", reg.digestRef())
	in := []byte(`{"codes": [
		"x = 1",
		"import os",
		{"language": "shell", "code": "mkdir -p /tmp/a"},
		"raise ValueError('loud')",
		{"language": "shell", "code": "true"}
	]}`)
	for _, target := range [][]string{{"--image", reg.digestRef()}, {"--sandbox", "quiet"}} {
		t.Run(target[0][2:], func(t *testing.T) {
			results := runBatch(t, root, in, 5, target...)
			for i, r := range results {
				if i == 3 {
					if r.ExitCode != 1 || r.Stdout != "" || !strings.Contains(r.Stderr, "ValueError: loud") {
						t.Errorf("failing snippet %d: %+v", i, r)
					}
					continue
				}
				if r.ExitCode != 0 || r.Stdout != "" || r.Stderr != "" || r.StdoutBase64 != "" || r.StderrBase64 != "" {
					t.Errorf("silent snippet %d: %+v, want exit 0 and no output", i, r)
				}
			}
		})
	}
	// The shell snippet ran in the sandbox: its directory is there.
	if out := mustFlmbox(t, root, "run", "--sandbox", "quiet", "-l", "shell", "-c", "test -d /tmp/a && echo yes"); out != "yes\n" {
		t.Errorf("after the batch in sandbox quiet: %q", out)
	}
}

// TestEnvPythonPathKeepsSitePackages: --env PYTHONPATH=/x adds /x after
// /tmp/site-packages, where pip installs, instead of replacing it: what
// --pip preinstalled still imports. (flmbox once let the caller's
// PYTHONPATH override its own, so nothing pip installed imported.)
func TestEnvPythonPathKeepsSitePackages(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	mustFlmbox(t, root, "pipcache", "add", writeTestWheel(t, t.TempDir(), "flmbox-pp", "1.0"))
	mustFlmbox(t, root, "sandbox", "create", "--name", "pp", "--image", reg.digestRef(), "--env", "PYTHONPATH=/x", "--pip", "flmbox-pp")
	out := mustFlmbox(t, root, "run", "--sandbox", "pp", "-c", `
import json, os, sys
import flmbox_pp
print(json.dumps({"greeting": flmbox_pp.GREETING, "pythonpath": os.environ.get("PYTHONPATH"), "path": sys.path}))
`)
	var got struct {
		Greeting, Pythonpath string
		Path                 []string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("the call printed %q: %v", out, err)
	}
	if got.Greeting != "hello from flmbox-pp 1.0" {
		t.Errorf("greeting %q", got.Greeting)
	}
	if got.Pythonpath != "/tmp/site-packages:/x" {
		t.Errorf("PYTHONPATH %q, want /tmp/site-packages:/x", got.Pythonpath)
	}
	index := func(p string) int {
		for i, q := range got.Path {
			if q == p {
				return i
			}
		}
		return -1
	}
	if site, x := index("/tmp/site-packages"), index("/x"); site < 0 || x < 0 || site > x {
		t.Errorf("sys.path %q: want /tmp/site-packages, then /x", got.Path)
	}
}

// slowRunsc writes a runsc wrapper that runs the real runsc with its
// arguments and, after a runsc run (whose exit status it writes into the
// file mark), hangs: the flmbox that called it waits for it forever.
func slowRunsc(t *testing.T, mark string) string {
	t.Helper()
	script := fmt.Sprintf(`#!/bin/sh
%q "$@"
rc=$?
for a in "$@"; do
	if [ "$a" = run ]; then
		echo $rc > %q.tmp && mv %q.tmp %q
		exec sleep infinity
	fi
done
exit $rc
`, runscPath, mark, mark, mark)
	p := filepath.Join(t.TempDir(), "runsc")
	testprog.Write(t, p, []byte(script))
	return p
}

// killedCreate runs flmbox-core sandbox create --name name in root with a
// runsc that hangs once its runsc run has returned, kills flmbox-core's
// whole process group at that moment (after the lease, with the runsc
// container running, before the agent was waited for), and returns the
// runsc container ID its record held.
func killedCreate(t *testing.T, root, image, name string) string {
	t.Helper()
	mark := filepath.Join(t.TempDir(), "ran")
	k := startKillable(t, exec.Command(flmboxCore, "--root", root, "--runsc", slowRunsc(t, mark), "sandbox", "create", "--name", name, "--image", image))
	kill := k.kill
	var rc []byte
	pollUntil(t, 2*time.Minute, "runsc run returned under flmbox-core", func() bool {
		k.mustRun(t, "flmbox-core")
		var err error
		rc, err = os.ReadFile(mark)
		return err == nil
	})
	if strings.TrimSpace(string(rc)) != "0" {
		kill()
		t.Fatalf("runsc run failed (exit %s) under flmbox-core:\n%s", bytes.TrimSpace(rc), k.out.Bytes())
	}
	var rec struct{ ID, State string }
	b, err := os.ReadFile(filepath.Join(stateroot.Sandbox(root, name), "sandbox.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.ID == "" || rec.State != "creating" {
		kill()
		t.Fatalf("record of the sandbox being created: %q: %v", b, err)
	}
	if runscProcesses(t, rec.ID) == 0 {
		kill()
		t.Fatalf("no host process names the container %s that runsc run started", rec.ID)
	}
	kill()
	t.Logf("killed flmbox-core after runsc run; %d host processes of %s remain", runscProcesses(t, rec.ID), rec.ID)
	return rec.ID
}

// killable is a process in a process group of its own, which the test
// SIGKILLs (or its cleanup does).
type killable struct {
	cmd    *exec.Cmd
	out    bytes.Buffer // its stdout and stderr
	exited chan error
	killed bool
}

// startKillable starts cmd in a process group of its own.
func startKillable(t *testing.T, cmd *exec.Cmd) *killable {
	t.Helper()
	k := &killable{cmd: cmd, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = &k.out, &k.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { k.exited <- cmd.Wait() }()
	t.Cleanup(k.kill)
	return k
}

// kill SIGKILLs the process group and reaps the process, once.
func (k *killable) kill() {
	if !k.killed {
		syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
		k.killed = true
	}
}

// mustRun fails the test if the process, what, exited before it was killed.
func (k *killable) mustRun(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-k.exited:
		k.killed = true
		t.Fatalf("%s exited before it was killed: %v\n%s", what, err, k.out.Bytes())
	default:
	}
}

// leases lists the image leases under root, without reconciling them.
func leases(t *testing.T, root string) []rootfs.Lease {
	t.Helper()
	store, err := rootfs.OpenStore(stateroot.Images(root))
	if err != nil {
		t.Fatal(err)
	}
	ls, err := store.Leases()
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// noCgroups fails the test if a host cgroup of container id is left
// (runsc makes them at /sys/fs/cgroup/CONTROLLER/ID, or /sys/fs/cgroup/ID
// under cgroup v2 alone).
func noCgroups(t *testing.T, id string) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", id)); err == nil {
		left = append(left, filepath.Join("/sys/fs/cgroup", id))
	}
	if len(left) > 0 {
		t.Fatalf("cgroups of container %s are left: %v", id, left)
	}
}

// TestCreateKilledDuringRunscRun: a sandbox create killed while runsc run
// was making its container (runsc's sandbox process already up, runsc's
// command and its state unfinished) leaves nothing either: the next
// sandbox ls removes the container, its processes and host cgroups, the
// image's lease and the sandbox's directory, and the name can be taken
// again. (The cgroups were once left: runsc removes only those it made and
// knows of.)
func TestCreateKilledDuringRunscRun(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	image := reg.digestRef()
	root := sandboxRoot(t, reg)
	var id string
	booted := func() bool {
		var rec struct{ ID string }
		b, err := os.ReadFile(filepath.Join(stateroot.Sandbox(root, "half"), "sandbox.json"))
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.ID == "" {
			return false
		}
		id = rec.ID
		out, _ := exec.Command("pgrep", "-f", "runsc-sandbox .*"+id).Output()
		return len(strings.Fields(string(out))) > 0
	}
	if !killAt(t, root, killPoint{verb: "run", when: "during", until: booted}, "sandbox", "create", "--name", "half", "--image", image) {
		t.Fatal("runsc run ended before its sandbox process was seen")
	}
	t.Logf("killed flmbox while runsc run made %s; %d host processes name it", id, runscProcesses(t, id))
	if names := sandboxNames(t, root); len(names) != 0 {
		t.Fatalf("sandbox ls after the killed create: %v", names)
	}
	waitNoProcesses(t, id)
	if ls := leases(t, root); len(ls) != 0 {
		t.Fatalf("leases left after sandbox ls: %+v", ls)
	}
	if _, err := os.Stat(stateroot.Sandbox(root, "half")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the killed sandbox's directory is left: %v", err)
	}
	if n := suspendRunscCount(t, root, id); n != 0 {
		t.Fatalf("runsc still knows %d containers %s", n, id)
	}
	noCgroups(t, id)
	if out := mustFlmbox(t, root, "sandbox", "create", "--name", "half", "--image", image); out != "half\n" {
		t.Fatalf("sandbox create printed %q", out)
	}
	checkAlive(t, root, "half")
}

// TestCreateKilledAfterItsLease: a sandbox create killed once it had
// leased its image and runsc had started its container leaves nothing that
// keeps the image or the name: the next sandbox ls reconciles it away
// (container, lease, directory), and so does the next create of the same
// name by itself. (flmbox once left a sandbox that ls listed as running, a
// lease no sandbox would release, and a name no create could take.)
func TestCreateKilledAfterItsLease(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	image := reg.digestRef()

	t.Run("ls first", func(t *testing.T) {
		root := removableSandboxRoot(t, reg)
		id := killedCreate(t, root, image, "same")
		if names := sandboxNames(t, root); len(names) != 0 {
			t.Fatalf("sandbox ls after the killed create: %v", names)
		}
		if ls := leases(t, root); len(ls) != 0 {
			t.Fatalf("leases left after sandbox ls: %+v", ls)
		}
		if _, err := os.Stat(stateroot.Sandbox(root, "same")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the killed sandbox's directory is left: %v", err)
		}
		waitNoProcesses(t, id)
		noCgroups(t, id)
		if out := mustFlmbox(t, root, "sandbox", "create", "--name", "same", "--image", image); out != "same\n" {
			t.Fatalf("sandbox create printed %q", out)
		}
		checkAlive(t, root, "same")
		if newID := sandboxID(t, root, "same"); newID == id {
			t.Fatalf("the new sandbox has the killed one's container ID %s", id)
		}
		// Nothing of the killed create keeps the image once the new
		// sandbox is gone.
		mustFlmbox(t, root, "sandbox", "rm", "same")
		if out := mustFlmbox(t, root, "images", "rm", image); !strings.Contains(out, "Deleted: ") {
			t.Fatalf("images rm printed %q", out)
		}
	})

	t.Run("create first", func(t *testing.T) {
		root := sandboxRoot(t, reg)
		id := killedCreate(t, root, image, "same")
		if out := mustFlmbox(t, root, "sandbox", "create", "--name", "same", "--image", image); out != "same\n" {
			t.Fatalf("sandbox create printed %q", out)
		}
		waitNoProcesses(t, id)
		noCgroups(t, id)
		checkAlive(t, root, "same")
		if newID := sandboxID(t, root, "same"); newID == id {
			t.Fatalf("the new sandbox has the killed one's container ID %s", id)
		}
		if names := sandboxNames(t, root); len(names) != 1 || names["same"] != "running" {
			t.Fatalf("sandbox ls: %v", names)
		}
		if ls := leases(t, root); len(ls) != 1 || ls[0].Holder != "same."+sandboxID(t, root, "same") {
			t.Fatalf("leases: %+v", ls)
		}
	})
}
