package snippet

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// fakeMemInfo is a /proc/meminfo file whose MemAvailable the test sets.
type fakeMemInfo string

func newFakeMemInfo(t *testing.T) fakeMemInfo {
	f := fakeMemInfo(filepath.Join(t.TempDir(), "meminfo"))
	f.set(t, 400<<20)
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

// TestMemoryWatchKillsGrowingSnippet: once the sandbox has less than the
// reserve left, and less than when the snippet started, the snippet is
// killed and reported out of memory, in both languages.
func TestMemoryWatchKillsGrowingSnippet(t *testing.T) {
	for _, tc := range []struct{ lang, code string }{
		{LanguageShell, "echo started; sleep 20 & sleep 20"},
		{LanguagePython, "import time\nprint('started', flush=True)\ntime.sleep(20)"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			mem := newFakeMemInfo(t)
			a := &Agent{Python: hostPython(t), Dir: t.TempDir(), MemInfo: string(mem)}
			go func() {
				time.Sleep(200 * time.Millisecond) // the watch has read 400 MiB
				mem.set(t, 20<<20)
			}()
			start := time.Now()
			res := run(t, a, request(tc.lang, tc.code))
			if !res.OOMKilled || res.ExitCode != 137 || res.Signal != "SIGKILL" || res.TimedOut || res.Error != "" {
				t.Fatalf("want killed out of memory, got %s (oom_killed %v)", dump(res), res.OOMKilled)
			}
			if string(res.Stdout.Data) != "started\n" || time.Since(start) > 10*time.Second {
				t.Fatalf("after %s: %s", time.Since(start), dump(res))
			}
			// The next call runs: memory is short but does not shrink.
			if res := run(t, a, request(LanguageShell, "sleep 0.05; echo next")); res.OOMKilled || string(res.Stdout.Data) != "next\n" {
				t.Fatalf("the next call: %s (oom_killed %v)", dump(res), res.OOMKilled)
			}
		})
	}
}

// TestMemoryWatchSparesSnippetsThatDoNotGrow: a snippet that starts with
// memory already short and does not use more runs to its end (a /tmp that
// fills the sandbox can still be emptied), and so does one on a sandbox with
// memory to spare.
func TestMemoryWatchSparesSnippetsThatDoNotGrow(t *testing.T) {
	mem := newFakeMemInfo(t)
	a := &Agent{Dir: t.TempDir(), MemInfo: string(mem)}
	if res := run(t, a, request(LanguageShell, "sleep 0.1; echo plenty")); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "plenty\n" {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	mem.set(t, 10<<20)
	if res := run(t, a, request(LanguageShell, "sleep 0.1; echo short")); res.OOMKilled || res.ExitCode != 0 || string(res.Stdout.Data) != "short\n" {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
	// Memory given back while a snippet runs does not count as growth.
	go func() {
		time.Sleep(100 * time.Millisecond)
		mem.set(t, 300<<20)
		time.Sleep(100 * time.Millisecond)
		mem.set(t, 200<<20)
	}()
	if res := run(t, a, request(LanguageShell, "sleep 0.4; echo freed")); res.OOMKilled || string(res.Stdout.Data) != "freed\n" {
		t.Fatalf("%s (oom_killed %v)", dump(res), res.OOMKilled)
	}
}

// TestMemoryWatchUnreadableFile: a missing or malformed file turns the watch
// into a no-op, never a failed call.
func TestMemoryWatchUnreadableFile(t *testing.T) {
	a := &Agent{Dir: t.TempDir(), MemInfo: filepath.Join(t.TempDir(), "missing")}
	if res := run(t, a, request(LanguageShell, "sleep 0.05; echo ok")); res.OOMKilled || string(res.Stdout.Data) != "ok\n" {
		t.Fatalf("%s", dump(res))
	}
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

// TestMemoryWatchBudget: with a budget under MemTotal (the cgroup's limit
// is above the budget), the watch kills once the budget is nearly used, while
// MemTotal still has room.
func TestMemoryWatchBudget(t *testing.T) {
	mem := newFakeMemInfo(t) // 512 MiB, 400 available: 112 used
	a := &Agent{Dir: t.TempDir(), MemInfo: string(mem), MemoryBudget: 256 << 20}
	go func() {
		time.Sleep(200 * time.Millisecond)
		mem.set(t, 300<<20) // 212 used: 44 left of the budget, over its reserve of 16
		time.Sleep(200 * time.Millisecond)
		mem.set(t, 270<<20) // 242 used: 14 left
	}()
	start := time.Now()
	res := run(t, a, request(LanguageShell, "sleep 20"))
	if !res.OOMKilled || res.ExitCode != 137 || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("after %s: %s (oom_killed %v)", time.Since(start), dump(res), res.OOMKilled)
	}
}
