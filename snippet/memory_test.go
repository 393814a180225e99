package snippet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// Not parallel: the tests of the watch that run snippets. Each waits for the
// watch to read and act before its snippet's timeout (guard), which a test
// process crowded by other tests on a loaded machine missed.

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
	waitWatched(t, a, n, true)
}

// waitWatched waits until the watch watches n snippets; with read, until
// it has read the memory for each of them.
func waitWatched(t *testing.T, a *Agent, n int, read bool) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("the watch to watch %d snippets (read the memory for each: %v)", n, read), func() bool {
		a.mem.mu.Lock()
		defer a.mem.mu.Unlock()
		got := 0
		for _, first := range a.mem.procs {
			if first >= 0 || !read {
				got++
			}
		}
		return got == n
	})
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

// waitSpared waits until the watch has checked the memory three more times
// while it watches n snippets: at least the last two checks read the memory
// after waitSpared was called and acted on it, so that a change made before
// (to the file, or a snippet gone) was seen. It fails if the watch stops
// watching one of them, which it does when it kills it: the snippets must
// not end by themselves meanwhile.
func waitSpared(t *testing.T, a *Agent, n int) {
	t.Helper()
	a.mem.mu.Lock()
	want := a.mem.checks + 3
	a.mem.mu.Unlock()
	for deadline := time.Now().Add(guard); ; time.Sleep(time.Millisecond) {
		a.mem.mu.Lock()
		checks, watched := a.mem.checks, len(a.mem.procs)
		a.mem.mu.Unlock()
		if watched != n {
			t.Fatalf("the watch watches %d snippets, want %d: it killed one", watched, n)
		}
		if checks >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch checked the memory %d times, want %d", checks, want)
		}
	}
}

// untilFile is shell code that waits until file name exists in the
// snippet's directory (the test creates it with release).
func untilFile(name string) string {
	return "until [ -e " + name + " ]; do sleep 0.01; done; "
}

// release creates file name in a's directory.
func release(t *testing.T, a *Agent, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(a.Dir, name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitFile waits until file name exists in a's directory.
func waitFile(t *testing.T, a *Agent, name string) {
	t.Helper()
	waitUntil(t, "the snippet to create "+name, func() bool {
		_, err := os.Stat(filepath.Join(a.Dir, name))
		return err == nil
	})
}

// waitWatchIdle fails unless the watch stops its timer once no call runs.
func waitWatchIdle(t *testing.T, a *Agent) {
	t.Helper()
	waitUntil(t, "the memory watch to stop with no call", func() bool {
		a.mem.mu.Lock()
		defer a.mem.mu.Unlock()
		return a.mem.timer == nil && len(a.mem.procs) == 0 && len(a.mem.dying) == 0
	})
}

// TestMemoryWatchKillsGrowingSnippet: once the sandbox has less than the
// reserve left, and uses more than at the snippet's first read, the snippet
// is killed and reported out of memory, in both languages, with what it
// printed before.
func TestMemoryWatchKillsGrowingSnippet(t *testing.T) {
	for _, tc := range []struct{ lang, code string }{
		{wire.LanguageShell, "echo started; touch started; sleep 20 & sleep 20"},
		{wire.LanguagePython, "import time\nprint('started', flush=True)\nopen('started', 'w').close()\ntime.sleep(20)"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			mem := newFakeMemInfo(t, 400<<20)
			a := &Agent{Python: hostPython(t), Dir: t.TempDir(), MemInfo: string(mem)}
			done := startRun(a, request(tc.lang, tc.code))
			waitFile(t, a, "started") // it printed
			waitFirstRead(t, a, 1)
			mem.set(t, 20<<20)
			res := result(t, done)
			if !res.OOMKilled || res.ExitCode != 137 || res.Signal != "SIGKILL" || res.TimedOut || res.Error != "" {
				t.Fatalf("want killed out of memory, got %s (oom_killed %v)", dump(res), res.OOMKilled)
			}
			if string(res.Stdout.Data) != "started\n" {
				t.Fatalf("want what it printed: %s", dump(res))
			}
			// The next call runs: memory is short but does not shrink.
			done = startRun(a, request(wire.LanguageShell, untilFile("next")+"echo next"))
			waitFirstRead(t, a, 1)
			waitSpared(t, a, 1)
			release(t, a, "next")
			if res := result(t, done); res.OOMKilled || string(res.Stdout.Data) != "next\n" {
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
	done := startRun(a, request(wire.LanguageShell, untilFile("plenty")+"echo plenty"))
	waitFirstRead(t, a, 1)
	waitSpared(t, a, 1)
	release(t, a, "plenty")
	if res := result(t, done); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "plenty\n" {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	// Short all along (the reserve of 512 MiB is 32 MiB): memory given back
	// and used again, or a little more used, is no growth.
	mem.set(t, 20<<20)
	done = startRun(a, request(wire.LanguageShell, untilFile("short")+"echo short"))
	waitFirstRead(t, a, 1)
	for _, avail := range []int64{30 << 20, 25 << 20, 17 << 20} {
		mem.set(t, avail)
		waitSpared(t, a, 1)
	}
	release(t, a, "short")
	if res := result(t, done); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "short\n" {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	// One MiB more than the tolerance of 16 MiB is growth.
	mem.set(t, 20<<20)
	done = startRun(a, request(wire.LanguageShell, "sleep 20"))
	waitFirstRead(t, a, 1)
	mem.set(t, 3<<20)
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
	small := startRun(a, request(wire.LanguageShell, untilFile("small.go")+"echo small"))
	// It says it is ready once it holds its 64 MiB and has printed.
	big := startRun(a, request(wire.LanguagePython, "import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('big', flush=True)\nopen('big.ready', 'w').close()\ntime.sleep(20)"))
	waitFile(t, a, "big.ready")
	waitFirstRead(t, a, 2)
	mem.set(t, 10<<20)
	if res := result(t, big); !res.OOMKilled || string(res.Stdout.Data) != "big\n" {
		t.Fatalf("the big snippet: %s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	// The big one is gone and memory stays short: the small one is not
	// blamed for what the big one took.
	waitSpared(t, a, 1)
	release(t, a, "small.go")
	if res := result(t, small); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "small\n" {
		t.Fatalf("the small snippet: %s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	waitWatchIdle(t, a)
}

// TestMemoryWatchCountsFiles: in gVisor a file's metadata is memory that
// /proc/meminfo does not show; the watch counts InodeBytes for each inode
// used in CleanDirs, so that a snippet making empty files is killed like one
// that allocates. Not parallel: it replaces usedInodes.
func TestMemoryWatchCountsFiles(t *testing.T) {
	var inodes atomic.Int64
	usedInodes = func(string) int64 { return inodes.Load() }
	t.Cleanup(func() { usedInodes = usedInodesStatfs })
	mem := newFakeMemInfo(t, 400<<20) // 112 MiB used of 512
	dir := t.TempDir()
	a := &Agent{Dir: dir, MemInfo: string(mem), CleanDirs: []string{dir}, InodeBytes: 10 << 10}
	done := startRun(a, request(wire.LanguageShell, "sleep 20"))
	waitFirstRead(t, a, 1)
	inodes.Store(20_000) // 195 MiB more: 205 left
	waitSpared(t, a, 1)
	inodes.Store(38_000) // 371 MiB more: 29 MiB left, under the reserve of 32
	if res := result(t, done); !res.OOMKilled || res.ExitCode != 137 {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	waitWatchIdle(t, a)
}

// TestMemoryWatchKillsSparesFirst: when memory runs short, the spares are
// killed first and the calls running blamed only for what they use after:
// a spare that started next to a call (after the previous call's answer)
// made the call look as if it grew, and a clean-up call after a snippet
// killed for memory was killed too. While memory is short, no spare starts.
func TestMemoryWatchKillsSparesFirst(t *testing.T) {
	mem := newFakeMemInfo(t, 400<<20)
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), MemInfo: string(mem), Spares: true}
	t.Cleanup(func() { a.Close() })
	if res := result(t, startRun(a, request(wire.LanguagePython, "pass"))); res.ExitCode != 0 {
		t.Fatal(dump(res))
	}
	waitSpare(t, a, wire.LanguagePython)
	done := startRun(a, request(wire.LanguageShell, untilFile("go")+"echo ok"))
	waitFirstRead(t, a, 1)
	mem.set(t, 20<<20) // what the Python spare took, say
	waitUntil(t, "the spare killed", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.spares[wire.LanguagePython] == nil
	})
	waitSpared(t, a, 1)
	release(t, a, "go")
	if res := result(t, done); res.OOMKilled || string(res.Stdout.Data) != "ok\n" {
		t.Fatalf("the call next to the spare: %s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	if !a.memoryShort() {
		t.Fatal("memory is short, and memoryShort says it is not")
	}
	// A call that grows is still killed.
	done = startRun(a, request(wire.LanguageShell, "sleep 20"))
	waitFirstRead(t, a, 1)
	mem.set(t, 2<<20) // 18 MiB more: over the tolerance of 16
	if res := result(t, done); !res.OOMKilled {
		t.Fatalf("the call that grew: %s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	waitWatchIdle(t, a)
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
	waitSpared(t, a, 1)
	mem.set(t, 270<<20) // 242 used: 14 left
	if res := result(t, done); !res.OOMKilled || res.ExitCode != 137 {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
}

// TestMemoryWatchUnreadableFile: a missing file turns the watch into a no-op,
// never a failed call.
func TestMemoryWatchUnreadableFile(t *testing.T) {
	a := &Agent{Dir: t.TempDir(), MemInfo: filepath.Join(t.TempDir(), "missing")}
	done := startRun(a, request(wire.LanguageShell, untilFile("go")+"echo ok"))
	waitWatched(t, a, 1, false)
	waitSpared(t, a, 1) // it keeps trying
	release(t, a, "go")
	if res := result(t, done); res.OOMKilled || string(res.Stdout.Data) != "ok\n" {
		t.Fatalf("%s", dump(res))
	}
	waitWatchIdle(t, a)
}

func TestReadMemInfo(t *testing.T) {
	t.Parallel()
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
			if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			total, avail, ok := (&Agent{MemInfo: path}).readMemInfo()
			if ok != tc.ok || ok && (total != tc.total || avail != tc.avail) {
				t.Fatalf("got %d %d %v, want %d %d %v", total, avail, ok, tc.total, tc.avail, tc.ok)
			}
		})
	}
	if _, _, ok := (&Agent{MemInfo: "/proc/meminfo"}).readMemInfo(); !ok {
		t.Fatal("this machine's /proc/meminfo does not parse")
	}
}

func TestMemReserve(t *testing.T) {
	t.Parallel()
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

// TestMemoryWatchCountsGrowthMemInfoDoesNotShowYet: gVisor refreshes
// /proc/meminfo only every so often (by steps of up to 163 MiB next to fast
// growing processes): a snippet whose processes grow meanwhile is seen by
// their resident memory, and killed.
func TestMemoryWatchCountsGrowthMemInfoDoesNotShowYet(t *testing.T) {
	mem := newFakeMemInfo(t, 20<<20) // short: the reserve of 512 MiB is 32 MiB; and it never changes
	a := &Agent{Dir: t.TempDir(), MemInfo: string(mem)}
	done := startRun(a, request(wire.LanguagePython, "import os, time\n"+
		"while not os.path.exists('grow'): time.sleep(0.01)\n"+
		"x = b'x' * (64 << 20)\n"+
		"time.sleep(60)"))
	waitFirstRead(t, a, 1)
	waitSpared(t, a, 1)
	release(t, a, "grow")
	if res := result(t, done); !res.OOMKilled {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	waitWatchIdle(t, a)
}

// TestMemInterval: the watch reads every memPollMax far from the budget,
// sooner as what is left nears twice the reserve (at memGrowthRate for each
// CPU), never sooner than memPoll above it, every memPollShort below it.
func TestMemInterval(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	reserve := memReserve(512 * mib) // 32 MiB
	for _, c := range []struct {
		left int64
		cpus int
		want time.Duration
	}{
		{472 * mib, 1, 99609375},                   // a new sandbox: 40 MiB used, 408 MiB above the line
		{2*reserve + 200*mib, 1, 48828125},         // 200 MiB above the line at 4 GiB/s
		{2*reserve + 200*mib, 2, 24414062},         // twice as fast on two CPUs
		{2*reserve + 4*mib, 1, memPoll},            // close: memPoll at least
		{2 * reserve, 1, memPoll},                  // on the line
		{2*reserve - 1, 1, memPollShort},           // short
		{-100 * mib, 1, memPollShort},              // over the budget
		{2*reserve + 200*mib, 0, 48828125},         // no CPU count: one
		{1 << 40, 64, memPollMax},                  // huge
		{2*reserve + memGrowthRate, 1, memPollMax}, // a second away
	} {
		if got := memInterval(c.left, reserve, c.cpus); got != c.want {
			t.Errorf("memInterval(%d MiB left, %d CPUs) = %v, want %v", c.left/mib, c.cpus, got, c.want)
		}
	}
	// For nudged calls, at the pace of growth the host does not see.
	for _, c := range []struct {
		left, reserve int64
		want          time.Duration
	}{
		{472 * mib, 32 * mib, 796875000},   // a new 512 MiB sandbox: 0.8 s
		{230 * mib, 16 * mib, 386718750},   // a 256 MiB one: 0.39 s
		{40 * mib, 16 * mib, memPollMax},   // close: memPollMax at least
		{31 * mib, 16 * mib, memPollShort}, // short: as for any call
		{1 << 40, 128 * mib, memPollNudged},
	} {
		if got := memNudgedInterval(c.left, c.reserve, 2); got != c.want {
			t.Errorf("memNudgedInterval(%d MiB left, reserve %d MiB, 2 CPUs) = %v, want %v", c.left/mib, c.reserve/mib, got, c.want)
		}
	}
}

// TestReadMemInfoKeepsProcOpen: /proc/meminfo is opened once and read
// again at offset 0 (procfs makes it anew); another file is opened for each
// read, so that a test's file replaced by a rename is read anew.
func TestReadMemInfoKeepsProcOpen(t *testing.T) {
	t.Parallel()
	a := &Agent{MemInfo: "/proc/meminfo"}
	for range 2 {
		if total, avail, ok := a.readMemInfo(); !ok || total <= 0 || avail <= 0 {
			t.Fatalf("readMemInfo of /proc/meminfo = %d, %d, %v", total, avail, ok)
		}
	}
	if a.mem.info == nil {
		t.Errorf("/proc/meminfo is not kept open")
	}
	a.mem.info.Close()

	mem := newFakeMemInfo(t, 400<<20)
	b := &Agent{MemInfo: string(mem)}
	if _, avail, ok := b.readMemInfo(); !ok || avail != 400<<20 {
		t.Fatalf("readMemInfo = %d, %v; want 400 MiB available", avail, ok)
	}
	mem.set(t, 100<<20)
	if _, avail, ok := b.readMemInfo(); !ok || avail != 100<<20 || b.mem.info != nil {
		t.Fatalf("readMemInfo after the file changed = %d, %v (kept open: %v); want 100 MiB available", avail, ok, b.mem.info != nil)
	}
}

// TestMemoryWatchReadsWhenNudged: a call whose client nudges the agent as
// the host sees the sandbox's memory grow (wire.Request.MemoryNudges) has
// the watch read when nudged, through the call's connection, and by the
// clock only every memPollNudged while memory is not short: here never, so
// only the nudge can have the growing snippet killed. Not parallel: it
// changes memPollNudged and memUnseenRate.
func TestMemoryWatchReadsWhenNudged(t *testing.T) {
	defer func(d time.Duration, r int64) { memPollNudged, memUnseenRate = d, r }(memPollNudged, memUnseenRate)
	memPollNudged, memUnseenRate = time.Hour, 1 // no read by the clock for nudged calls
	mem := newFakeMemInfo(t, 400<<20)
	a := &Agent{Dir: t.TempDir(), MemInfo: string(mem)}
	sock := serve(t, a)
	var charged atomic.Int64
	charged.Store(100 << 20)
	done := make(chan *wire.Result, 1)
	go func() {
		res, err := wire.Call(context.Background(), sock, request(wire.LanguageShell, "sleep 20", func(r *wire.Request) {
			r.Charged = func() (int64, error) { return charged.Load(), nil }
		}))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitFirstRead(t, a, 1)
	a.mem.mu.Lock()
	nudged := a.mem.nudged
	a.mem.mu.Unlock()
	if len(nudged) != 1 {
		t.Fatalf("the watch knows of %d nudged calls, want 1", len(nudged))
	}
	// Memory grown past the budget is read once the client sees the
	// sandbox grow by a step.
	mem.set(t, 3<<20)
	charged.Add(wire.MemoryNudgeStep)
	res := result(t, done)
	if res == nil || !res.OOMKilled {
		t.Fatalf("want killed out of memory: %s", dump(res))
	}
	a.mem.mu.Lock()
	nudges := a.mem.nudges
	a.mem.mu.Unlock()
	if nudges == 0 {
		t.Fatal("killed with no nudge")
	}
	waitWatchIdle(t, a)
}

// TestMemoryWatchReadsByTheClockForClientsThatDoNotNudge: a call whose
// client does not nudge has the watch read by the clock, next to one that
// does (whose reads alone would wait memPollNudged, an hour here). Not
// parallel: it changes memPollNudged and memUnseenRate.
func TestMemoryWatchReadsByTheClockForClientsThatDoNotNudge(t *testing.T) {
	defer func(d time.Duration, r int64) { memPollNudged, memUnseenRate = d, r }(memPollNudged, memUnseenRate)
	memPollNudged, memUnseenRate = time.Hour, 1 // no read by the clock for nudged calls
	mem := newFakeMemInfo(t, 400<<20)
	a := &Agent{Dir: t.TempDir(), MemInfo: string(mem)}
	nudged := startRun(a, request(wire.LanguageShell, untilFile("go")+"echo nudged", func(r *wire.Request) { r.MemoryNudges = true }))
	waitFirstRead(t, a, 1)
	plain := startRun(a, request(wire.LanguageShell, untilFile("go")+"echo plain"))
	waitFirstRead(t, a, 2)
	waitSpared(t, a, 2) // three more reads, with no nudge: by the clock
	release(t, a, "go")
	for name, done := range map[string]<-chan *wire.Result{"nudged": nudged, "plain": plain} {
		if res := result(t, done); res.OOMKilled || string(res.Stdout.Data) != name+"\n" {
			t.Fatalf("the %s call: %s", name, dump(res))
		}
	}
	waitWatchIdle(t, a)
}
