package record

import (
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/stateroot"
)

// TestOwner: this process is not gone; a live process with another start
// time (a reused pid), a zombie and a reaped process are; no owner, or one
// in another pid namespace, never is.
func TestOwner(t *testing.T) {
	me, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if me.PID != os.Getpid() || me.Start == 0 || me.PIDNS == 0 {
		t.Fatalf("Self = %+v", me)
	}
	if me.Gone() {
		t.Fatal("this process is gone")
	}
	reused := *me
	reused.Start++
	if !reused.Gone() {
		t.Error("a pid whose process started at another time is not gone")
	}
	elsewhere := reused
	elsewhere.PIDNS++
	if elsewhere.Gone() {
		t.Error("an owner in another pid namespace is gone: its pid cannot be looked up here")
	}
	var none *Owner
	if none.Gone() {
		t.Error("no owner is gone")
	}

	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	start, _, err := readStat(child.Process.Pid)
	if err != nil {
		child.Process.Kill()
		child.Wait()
		t.Fatal(err)
	}
	o := &Owner{PID: child.Process.Pid, Start: start, PIDNS: me.PIDNS}
	if o.Gone() {
		t.Error("a running child is gone")
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Exited, not reaped: a zombie until Wait.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, child.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if !o.Gone() {
		t.Error("a killed child (a zombie) is not gone")
	}
	child.Wait()
	if !o.Gone() {
		t.Error("a reaped child is not gone")
	}
}

// A record keeps its owner; one without keeps none.
func TestRecordOwner(t *testing.T) {
	root := t.TempDir()
	dir := stateroot.Sandbox(root, "sb-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	me, _ := Self()
	want := &Record{Name: "sb-1", State: Running, Owner: me, Dir: dir}
	if err := Write(want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(root, "sb-1")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, want)
	}
	want.Owner = nil
	b, _ := json.Marshal(want)
	var keys map[string]any
	json.Unmarshal(b, &keys)
	if _, ok := keys["owner"]; ok {
		t.Errorf("a record without an owner says %s", b)
	}
}
