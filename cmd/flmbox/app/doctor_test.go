package app

import (
	"strings"
	"testing"

	"github.com/flmbox/flmbox/sandbox"
)

// TestLimitAdvice: what doctor prints about a low host limit names the
// limit, its value, the sandboxes it allows, and what to set.
func TestLimitAdvice(t *testing.T) {
	for _, tc := range []struct {
		l         sandbox.HostLimit
		text, fix []string
	}{
		{sandbox.HostLimit{Name: sandbox.LimitPidMax, Value: 32768, Used: 1187, PerSandbox: 40, Sandboxes: 789, Low: true, Want: 4194304},
			[]string{"kernel.pid_max is 32768", "about 789 more idle sandboxes", "40 tasks each", "1187 in use", "819 in all"},
			[]string{"sysctl -w kernel.pid_max=4194304", "/etc/sysctl.d/"}},
		{sandbox.HostLimit{Name: sandbox.LimitThreadsMax, Value: 50000, Used: 2000, PerSandbox: 40, Sandboxes: 1200, Low: true, Want: 1 << 20},
			[]string{"kernel.threads-max is 50000", "about 1200 more"}, []string{"sysctl -w kernel.threads-max=1048576"}},
		{sandbox.HostLimit{Name: sandbox.LimitFileMax, Value: 100000, Used: 10000, PerSandbox: 270, Sandboxes: 333, Low: true, Want: 1 << 23},
			[]string{"fs.file-max is 100000", "270 open files each"}, []string{"sysctl -w fs.file-max=8388608"}},
		{sandbox.HostLimit{Name: sandbox.LimitNofile, Value: 1024, Used: 231, PerSandbox: 231, Sandboxes: -1, Low: true, Want: 1 << 20},
			[]string{"RLIMIT_NOFILE (hard) is 1024", "231 descriptors"}, []string{"ulimit -Hn 1048576", "LimitNOFILE=1048576"}},
		{sandbox.HostLimit{Name: sandbox.LimitMemory, Value: 4 << 30, Used: 4<<30 - 200<<20, PerSandbox: 24 << 20, Sandboxes: 8, Low: true},
			[]string{"MemAvailable is 200MiB", "about 8 more idle sandboxes (24MiB each)"}, []string{"sandbox gc --max-memory", "--lazy-spares"}},
	} {
		text, fix := limitText(tc.l), limitFix(tc.l)
		for _, w := range tc.text {
			if !strings.Contains(text, w) {
				t.Errorf("%s: %q lacks %q", tc.l.Name, text, w)
			}
		}
		for _, w := range tc.fix {
			if !strings.Contains(fix, w) {
				t.Errorf("%s: fix %q lacks %q", tc.l.Name, fix, w)
			}
		}
		tc.l.Low = false
		if f := limitFix(tc.l); f != "" {
			t.Errorf("%s: a limit that is not low gets a fix: %q", tc.l.Name, f)
		}
	}
}
