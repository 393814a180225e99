package snippet

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// fakeMemInfo is a /proc/meminfo file of a 512 MiB sandbox whose
// MemAvailable the test sets.
type fakeMemInfo string

func newFakeMemInfo(t *testing.T, avail int64) fakeMemInfo {
	f := fakeMemInfo(filepath.Join(t.TempDir(), "meminfo"))
	f.set(t, avail)
	return f
}

// set writes the file whole, as the kernel's is always read.
func (f fakeMemInfo) set(t *testing.T, avail int64) {
	t.Helper()
	tmp := string(f) + ".new"
	data := "MemTotal:         524288 kB\nMemFree:          1 kB\nMemAvailable:     " + strconv.FormatInt(avail>>10, 10) + " kB\nBuffers:               0 kB\n"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, string(f)); err != nil {
		t.Fatal(err)
	}
}

// waitFirstRead waits until the watch has read the memory for n running
// snippets.
func waitFirstRead(t *testing.T, a *Agent, n int) {
	t.Helper()
	for deadline := time.Now().Add(guard); ; time.Sleep(5 * time.Millisecond) {
		a.mem.mu.Lock()
		read := 0
		for _, first := range a.mem.procs {
			if first >= 0 {
				read++
			}
		}
		a.mem.mu.Unlock()
		if read == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch read the memory for %d snippets, want %d", read, n)
		}
	}
}

// startRun runs req in the background; the result comes on the channel.
func startRun(a *Agent, req *wire.Request) <-chan *wire.Result {
	done := make(chan *wire.Result, 1)
	go func() { done <- a.Run(context.Background(), req) }()
	return done
}

func result(t *testing.T, done <-chan *wire.Result) *wire.Result {
	t.Helper()
	select {
	case res := <-done:
		return res
	case <-time.After(guard + 5*time.Second):
		t.Fatal("the call did not return")
		return nil
	}
}

// waitWatchIdle fails unless the watch stops its timer once no call runs.
func waitWatchIdle(t *testing.T, a *Agent) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		a.mem.mu.Lock()
		idle := a.mem.timer == nil && len(a.mem.procs) == 0 && len(a.mem.dying) == 0
		a.mem.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the memory watch still runs with no call")
		}
	}
}

// TestMemoryWatchKillsGrowingSnippet: once the sandbox has less than the
// reserve left, and uses more than at the snippet's first read, the snippet
// is killed and reported out of memory, in both languages.
func TestMemoryWatchKillsGrowingSnippet(t *testing.T) {
	for _, tc := range []struct{ lang, code string }{
		{wire.LanguageShell, "echo started; sleep 20 & sleep 20"},
		{wire.LanguagePython, "import time\nprint('started', flush=True)\ntime.sleep(20)"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			mem := newFakeMemInfo(t, 400<<20)
			a := &Agent{Python: hostPython(t), Dir: t.TempDir(), MemInfo: string(mem)}
			start := time.Now()
			done := startRun(a, request(tc.lang, tc.code))
			waitFirstRead(t, a, 1)
			mem.set(t, 20<<20)
			res := result(t, done)
			if !res.OOMKilled || res.ExitCode != 137 || res.Signal != "SIGKILL" || res.TimedOut || res.Error != "" {
				t.Fatalf("want killed out of memory, got %s (oom_killed %v)", dump(res), res.OOMKilled)
			}
			if string(res.Stdout.Data) != "started\n" || time.Since(start) > 10*time.Second {
				t.Fatalf("after %s: %s", time.Since(start), dump(res))
			}
			// The next call runs: memory is short but does not shrink.
			if res := run(t, a, request(wire.LanguageShell, "sleep 0.1; echo next")); res.OOMKilled || string(res.Stdout.Data) != "next\n" {
				t.Fatalf("the next call: %s (oom_killed %v)", dump(res), res.OOMKilled)
			}
			waitWatchIdle(t, a)
		})
	}
}

// TestMemoryWatchSparesSnippetsThatDoNotGrow: a snippet that starts with
// memory already short and does not use more (beyond a tolerance) runs to its
// end, so that a /tmp that fills the sandbox can still be emptied.
func TestMemoryWatchSparesSnippetsThatDoNotGrow(t *testing.T) {
	mem := newFakeMemInfo(t, 400<<20)
	a := &Agent{Dir: t.TempDir(), MemInfo: string(mem)}
	if res := run(t, a, request(wire.LanguageShell, "sleep 0.1; echo plenty")); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "plenty\n" {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	// Short all along (the reserve of 512 MiB is 32 MiB): memory given back
	// and used again, or a little more used, is no growth.
	mem.set(t, 20<<20)
	done := startRun(a, request(wire.LanguageShell, "sleep 0.4; echo short"))
	waitFirstRead(t, a, 1)
	for _, avail := range []int64{30 << 20, 25 << 20, 17 << 20} {
		mem.set(t, avail)
		time.Sleep(20 * time.Millisecond) // some reads
	}
	if res := result(t, done); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "short\n" {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	// One MiB more than the tolerance of 4 MiB is growth.
	mem.set(t, 20<<20)
	done = startRun(a, request(wire.LanguageShell, "sleep 20"))
	waitFirstRead(t, a, 1)
	mem.set(t, 15<<20)
	if res := result(t, done); !res.OOMKilled {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	waitWatchIdle(t, a)
}

// TestMemoryWatchKillsTheBiggest: of two snippets running when memory runs
// out, the one whose processes hold more memory is killed, and the other,
// blamed only for what it uses after that, runs to its end.
func TestMemoryWatchKillsTheBiggest(t *testing.T) {
	mem := newFakeMemInfo(t, 400<<20)
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), MemInfo: string(mem)}
	small := startRun(a, request(wire.LanguageShell, "sleep 1.5; echo small"))
	big := startRun(a, request(wire.LanguagePython, "import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('big', flush=True)\ntime.sleep(20)"))
	waitFirstRead(t, a, 2)
	for deadline := time.Now().Add(guard); ; time.Sleep(10 * time.Millisecond) {
		if rss := groupsRSS()[bigPID(t, a)]; rss > 64<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the big snippet did not grow")
		}
	}
	mem.set(t, 10<<20)
	if res := result(t, big); !res.OOMKilled || string(res.Stdout.Data) != "big\n" {
		t.Fatalf("the big snippet: %s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	if res := result(t, small); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "small\n" {
		t.Fatalf("the small snippet: %s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	waitWatchIdle(t, a)
}

// bigPID returns the pid of the Python snippet among those watched.
func bigPID(t *testing.T, a *Agent) int {
	t.Helper()
	a.mem.mu.Lock()
	defer a.mem.mu.Unlock()
	for p := range a.mem.procs {
		if p.cmd.codeInGate && !p.cmd.stdinGate {
			return p.pid
		}
	}
	t.Fatal("no Python snippet is watched")
	return 0
}

// TestMemoryWatchBudget: with a budget under MemTotal (the cgroup's limit is
// above the budget), the watch kills once the budget is nearly used, while
// MemTotal still has room.
func TestMemoryWatchBudget(t *testing.T) {
	mem := newFakeMemInfo(t, 400<<20) // 112 MiB used
	a := &Agent{Dir: t.TempDir(), MemInfo: string(mem), MemoryBudget: 256 << 20}
	done := startRun(a, request(wire.LanguageShell, "sleep 20"))
	waitFirstRead(t, a, 1)
	mem.set(t, 300<<20) // 212 used: 44 MiB left of the budget, over its reserve of 16
	time.Sleep(50 * time.Millisecond)
	select {
	case res := <-done:
		t.Fatalf("killed with memory left: %s", dump(res))
	default:
	}
	mem.set(t, 270<<20) // 242 used: 14 left
	if res := result(t, done); !res.OOMKilled || res.ExitCode != 137 {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
}

// TestMemoryWatchUnreadableFile: a missing file turns the watch into a no-op,
// never a failed call.
func TestMemoryWatchUnreadableFile(t *testing.T) {
	a := &Agent{Dir: t.TempDir(), MemInfo: filepath.Join(t.TempDir(), "missing")}
	if res := run(t, a, request(wire.LanguageShell, "sleep 0.1; echo ok")); res.OOMKilled || string(res.Stdout.Data) != "ok\n" {
		t.Fatalf("%s", dump(res))
	}
	waitWatchIdle(t, a)
}

func TestReadMemInfo(t *testing.T) {
	for _, tc := range []struct {
		name, data   string
		total, avail int64
		ok           bool
	}{
		{"gvisor", "MemTotal:         524288 kB\nMemFree:          490692 kB\nMemAvailable:     490692 kB\nBuffers:               0 kB\n", 512 << 20, 490692 << 10, true},
		{"no available", "MemTotal:         524288 kB\nMemFree:          490692 kB\n", 0, 0, false},
		{"no total", "MemAvailable:     490692 kB\n", 0, 0, false},
		{"bad unit", "MemTotal:         524288 MB\nMemAvailable:     490692 kB\n", 0, 0, false},
		{"bad number", "MemTotal:         -5 kB\nMemAvailable:     490692 kB\n", 0, 0, false},
		{"empty", "", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "meminfo")
			os.WriteFile(path, []byte(tc.data), 0o644)
			total, avail, ok := readMemInfo(path)
			if ok != tc.ok || ok && (total != tc.total || avail != tc.avail) {
				t.Fatalf("got %d %d %v, want %d %d %v", total, avail, ok, tc.total, tc.avail, tc.ok)
			}
		})
	}
	if _, _, ok := readMemInfo("/proc/meminfo"); !ok {
		t.Fatal("this machine's /proc/meminfo does not parse")
	}
}

func TestMemReserve(t *testing.T) {
	for _, tc := range []struct{ total, want int64 }{
		{64 << 20, 16 << 20},
		{512 << 20, 32 << 20},
		{1 << 30, 64 << 20},
		{8 << 30, 128 << 20},
	} {
		if got := memReserve(tc.total); got != tc.want {
			t.Errorf("memReserve(%d MiB) = %d MiB, want %d MiB", tc.total>>20, got>>20, tc.want>>20)
		}
	}
}
