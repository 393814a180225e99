package sandbox

import (
	"strings"
	"testing"
)

// TestHostLimits: how many idle sandboxes each host limit allows, and which
// are low, from injected facts (no /proc).
func TestHostLimits(t *testing.T) {
	const gib = 1 << 30
	// This VM: 24 GiB, pid_max 32768, 1187 tasks.
	vm := hostFacts{pidMax: 32768, threadsMax: 192739, tasks: 1187, fileMax: 2466290, files: 3755, nofile: 20000,
		memTotal: 24 * gib, memAvailable: 22 * gib, memcgs: 675}
	type want struct {
		sandboxes int64
		low       bool
		want      int64
	}
	for _, tc := range []struct {
		name   string
		f      hostFacts
		limits map[LimitName]want
		warn   bool
		detail string
	}{
		{"this VM: pid_max caps the count", vm, map[LimitName]want{
			// (32768-1187)/40; memory could hold 24 GiB / 15 MiB = 1638,
			// pid_max 819 in all.
			LimitPidMax:     {789, true, 1 << 22},
			LimitThreadsMax: {4788, false, 0},
			LimitFileMax:    {9120, false, 0},
			LimitNofile:     {-1, false, 0},
			LimitMemory:     {938, false, 0}, // 22 GiB / 24 MiB
			LimitMemcgs:     {64860, false, 0},
		}, true, "room for about 789 more idle sandboxes, bound by kernel.pid_max (memory holds about 938)"},
		{"raised pid_max: memory bounds", hostFacts{pidMax: 1 << 22, threadsMax: 192739, tasks: 1187, fileMax: 2466290, files: 3755,
			nofile: 1 << 20, memTotal: 24 * gib, memAvailable: 22 * gib}, map[LimitName]want{
			LimitPidMax:     {104827, false, 0},
			LimitThreadsMax: {4788, false, 0},
			LimitMemory:     {938, false, 0},
		}, false, "room for about 938 more idle sandboxes, bound by memory (24MiB each)"},
		{"a big host: threads-max, file-max and nofile low", hostFacts{pidMax: 1 << 22, threadsMax: 50000, tasks: 2000, fileMax: 100000,
			files: 10000, nofile: 1024, memTotal: 256 * gib, memAvailable: 250 * gib}, map[LimitName]want{
			// memory could hold 256 GiB / 15 MiB = 17476 sandboxes:
			// 17476*40+2000 tasks, 17476*270+10000 files.
			LimitThreadsMax: {1200, true, 1 << 20},
			LimitFileMax:    {333, true, 1 << 23},
			LimitNofile:     {-1, true, 1 << 20},
			LimitMemory:     {10666, false, 0},
		}, true, "room for about 333 more idle sandboxes, bound by fs.file-max (memory holds about 10666)"},
		{"little memory left", hostFacts{pidMax: 1 << 22, memTotal: 4 * gib, memAvailable: 200 << 20}, map[LimitName]want{
			LimitMemory: {8, true, 0},
		}, true, "room for about 8 more idle sandboxes, bound by memory (24MiB each)"},
		{"limit used up", hostFacts{pidMax: 32768, tasks: 40000, memTotal: 24 * gib, memAvailable: 22 * gib}, map[LimitName]want{
			LimitPidMax: {0, true, 1 << 22},
		}, true, "room for about 0 more idle sandboxes, bound by kernel.pid_max"},
		{"nothing known", hostFacts{}, map[LimitName]want{}, false, "the host's limits are unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := checkHostLimits(tc.f)
			if ch.Name != CheckLimits || !ch.OK || ch.Warn != tc.warn || !strings.HasPrefix(ch.Detail, tc.detail) {
				t.Errorf("check %+v, want warn %v and detail %q", ch, tc.warn, tc.detail)
			}
			got := map[LimitName]HostLimit{}
			for _, l := range ch.Limits {
				got[l.Name] = l
			}
			for name, w := range tc.limits {
				l, ok := got[name]
				if !ok {
					t.Errorf("%s: missing", name)
					continue
				}
				if l.Sandboxes != w.sandboxes || l.Low != w.low || l.Want != w.want {
					t.Errorf("%s: %+v, want sandboxes %d low %v want %d", name, l, w.sandboxes, w.low, w.want)
				}
			}
		})
	}
}

// TestReadHostFacts reads this host's facts: every one is known on Linux.
func TestReadHostFacts(t *testing.T) {
	f := readHostFacts()
	if f.pidMax <= 0 || f.threadsMax <= 0 || f.tasks <= 0 || f.fileMax <= 0 || f.files <= 0 || f.nofile <= 0 ||
		f.memTotal <= 0 || f.memAvailable <= 0 || f.memAvailable > f.memTotal || f.tasks > f.pidMax {
		t.Fatalf("host facts %+v", f)
	}
}
