package procmem

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestContainer finds a real process tree by the ID that ends its command
// line, as runsc's boot and gofer processes name their container, and reads
// its memory.
func TestContainer(t *testing.T) {
	const id = "flmbox-procmem-test-0123456789ab"
	// sh's command line ends with the ID; it starts a child.
	cmd, pids := startTree(t, "sleep 30 & wait", id)
	if len(pids) != 2 || pids[0] != cmd.Process.Pid {
		t.Fatalf("processes %v, want sh (%d) and its sleep", pids, cmd.Process.Pid)
	}
	m, err := Of(pids)
	if err != nil {
		t.Fatal(err)
	}
	if m.Processes != 2 || m.RSS <= 0 || m.PSS <= 0 || m.PSS > m.RSS {
		t.Fatalf("memory %+v", m)
	}
	if pids, err := Container(id + "-none"); err != nil || len(pids) != 0 {
		t.Fatalf("found processes %v (%v) of a container nobody runs", pids, err)
	}
}

// TestUseCountsAnAddressSpaceOnce measures a process and one of its
// threads (a task sharing its address space and descriptor table, as
// systrap's stub threads share the sentry's): their memory and descriptors
// count once; a child process has an address space of its own.
func TestUseCountsAnAddressSpaceOnce(t *testing.T) {
	self := os.Getpid()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var tid int
	for _, e := range tasks {
		if n, _ := strconv.Atoi(e.Name()); n != self {
			tid = n
		}
	}
	if tid == 0 {
		t.Fatal("the test process has no thread but its main one")
	}
	if !same(self, tid, kcmpVM) {
		t.Fatalf("kcmp says thread %d does not share process %d's address space", tid, self)
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	if same(self, child.Process.Pid, kcmpVM) {
		t.Fatal("kcmp says a child process shares the test's address space")
	}
	alone, err := Of([]int{self})
	if err != nil {
		t.Fatal(err)
	}
	both, err := Of([]int{self, tid})
	if err != nil {
		t.Fatal(err)
	}
	if both.Processes != 2 || both.RSS > alone.RSS*3/2 {
		t.Fatalf("a process and its thread: %+v; the process alone: %+v (want its memory once)", both, alone)
	}
	u, uboth := useIn("/proc", []int{self}), useIn("/proc", []int{self, tid})
	if u.Processes != 1 || u.Tasks < 2 || u.FDs < 3 || u.PSS <= 0 || u.RSS < u.PSS {
		t.Fatalf("usage %+v", u)
	}
	if uboth.Processes != 2 || uboth.FDs > u.FDs*3/2 {
		t.Fatalf("a process and its thread: %+v; the process alone: %+v (want its descriptors once)", uboth, u)
	}
	if gone := useIn("/proc", []int{1 << 30}); gone.Processes != 0 {
		t.Fatalf("a process that does not exist: %+v", gone)
	}
}

// TestMatchingListsEachOnce: a matching process whose child matches too (a
// fork before its exec has its parent's command line) is listed once, and
// so is the child.
func TestMatchingListsEachOnce(t *testing.T) {
	const id = "flmbox-procmem-test-fork-0123456789"
	// sh and its subshell, a fork that never execs: both end with id.
	cmd, pids := startTree(t, "(while :; do sleep 1; done) & wait", id)
	seen := map[int]bool{}
	for _, p := range pids {
		if seen[p] {
			t.Fatalf("processes %v: %d twice", pids, p)
		}
		seen[p] = true
	}
	if len(pids) < 2 || pids[0] != cmd.Process.Pid {
		t.Fatalf("processes %v, want sh (%d) and its subshell", pids, cmd.Process.Pid)
	}
}

// startTree starts sh -c script with a command line ending in id, in a
// process group killed when the test ends, and polls Container(id) until it
// finds two processes (or 5 s pass).
func startTree(t *testing.T, script, id string) (*exec.Cmd, []int) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script, "sh", id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); len(pids) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		pids, _ = Container(id)
	}
	return cmd, pids
}

func TestParsers(t *testing.T) {
	// A command name with spaces and a parenthesis.
	stat := "16937 (runsc (sandbox) x) S 1 16937 16937 0 -1 4194560 1 0 0 0 250 75 0 0 20 0 19 0 1 1 1"
	if ppid, ticks, err := ParseStat([]byte(stat)); err != nil || ppid != 1 || ticks != 325 {
		t.Errorf("stat: ppid %d ticks %d %v", ppid, ticks, err)
	}
	if _, _, err := ParseStat([]byte("12 (x) S 1 2")); err == nil {
		t.Error("a short stat: no error")
	}
	rollup := "00400000-7ffdba35d000 ---p 00000000 00:00 0   [rollup]\nRss:               44572 kB\nPss:               14006 kB\nPss_Dirty:         13368 kB\n"
	if rss, pss := ParseRollup([]byte(rollup)); rss != 44572 || pss != 14006 {
		t.Errorf("rollup: rss %d pss %d", rss, pss)
	}
}

// TestContainers finds a container's processes in a fake /proc: those
// whose command line ends with its ID, and their descendants.
func TestContainers(t *testing.T) {
	proc := t.TempDir()
	add := func(pid, ppid int, cmdline ...string) {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := strconv.Itoa(pid) + " (exe) S " + strconv.Itoa(ppid) + " 1 1 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1"
		os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644)
		var b []byte
		for _, a := range cmdline {
			b = append(append(b, a...), 0)
		}
		os.WriteFile(filepath.Join(dir, "cmdline"), b, 0o644)
	}
	add(10, 1, "runsc-gofer", "--root=/r", "gofer", "--bundle", "/b", "flmbox-aaa")
	add(11, 1, "runsc-sandbox", "--root=/r", "boot", "flmbox-aaa")
	add(12, 11) // a stub: no command line
	add(13, 12)
	add(20, 1, "runsc-sandbox", "boot", "flmbox-bbb") // not asked for
	add(21, 20)
	add(30, 1, "sleep", "flmbox-aaa-not")
	add(31, 11, "runsc-sandbox", "--root=/r", "boot", "flmbox-aaa") // forked, not exec'd
	os.MkdirAll(filepath.Join(proc, "self"), 0o755)
	got, err := containersIn(proc, map[string]bool{"flmbox-aaa": true, "flmbox-ccc": true})
	if err != nil {
		t.Fatal(err)
	}
	pids := slices.Sorted(slices.Values(got["flmbox-aaa"]))
	if !slices.Equal(pids, []int{10, 11, 12, 13, 31}) || len(got) != 1 {
		t.Fatalf("processes %v, want flmbox-aaa: 10 11 12 13 31", got)
	}
	if ticks := ticksIn(proc, pids); ticks != 35 {
		t.Errorf("ticks %d, want 35", ticks)
	}
}
