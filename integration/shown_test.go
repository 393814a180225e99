//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// showCode prints what a sandbox shows its processes: os.cpu_count(), the
// CPUs of sched_getaffinity, the processors of /proc/cpuinfo, nproc's
// count, and MemTotal in kB.
const showCode = `
import os, subprocess
cpuinfo = sum(1 for l in open('/proc/cpuinfo') if l.startswith('processor'))
nproc = subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()
total = [l.split()[1] for l in open('/proc/meminfo') if l.startswith('MemTotal:')][0]
print(os.cpu_count(), len(os.sched_getaffinity(0)), cpuinfo, nproc, total)
`

// TestSandboxShowsWhatItWasGiven: a sandbox shows ceil(--cpus)
// CPUs (os.cpu_count(), sched_getaffinity, /proc/cpuinfo, nproc), so that
// thread pools size themselves right, and --memory as MemTotal, whose
// MemAvailable is near zero where the memory watch kills; also once
// resumed. On the host, its cgroups still allow what they did: the memory
// limit's headroom, every CPU (the quota bounds its time).
func TestSandboxShowsWhatItWasGiven(t *testing.T) {
	// Not parallel: a memory hog races the agent's memory watch.
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	hostCPUs, err := os.ReadFile("/sys/fs/cgroup/cpuset/cpuset.cpus")
	if err != nil {
		hostCPUs, err = os.ReadFile("/sys/fs/cgroup/cpuset.cpus.effective")
	}
	if err != nil {
		t.Fatalf("the host's CPUs: %v", err)
	}
	for _, tc := range []struct {
		name, cpus, memory, want string
		limit                    int64
	}{
		{"one", "1", "512MiB", "1 1 1 1 524288\n", 768 << 20},
		{"half", "0.5", "256MiB", "1 1 1 1 262144\n", 512 << 20},
		{"two", "2", "1GiB", "2 2 2 2 1048576\n", (1 << 30) + (256 << 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			createSandbox(t, root, reg, tc.name, "--cpus", tc.cpus, "--memory", tc.memory)
			if res := runIn(t, root, tc.name, showCode); res.code != 0 || res.stdout != tc.want {
				t.Fatalf("--cpus %s --memory %s shows (CPUs: os, affinity, cpuinfo, nproc; MemTotal kB) %q, want %q; stderr %s",
					tc.cpus, tc.memory, res.stdout, tc.want, res.stderr)
			}
			limit := readTrimmed(t, sandboxCgroupFile(t, root, tc.name, "memory", "memory.limit_in_bytes", "memory.max"))
			cpus := readTrimmed(t, sandboxCgroupFile(t, root, tc.name, "cpuset", "cpuset.cpus", "cpuset.cpus.effective"))
			if limit != strconv.FormatInt(tc.limit, 10) || cpus != strings.TrimSpace(string(hostCPUs)) {
				t.Errorf("the host's cgroups: memory limit %s, CPUs %s; want %d and the host's %s", limit, cpus, tc.limit, hostCPUs)
			}
		})
	}

	// Where the watch kills, MemAvailable is a fraction of MemTotal (with
	// MemTotal its cgroup's 768 MiB, a 512 MiB sandbox was killed with 287
	// MiB "available"; right, the watch kills with its reserve, 32 MiB,
	// left). gVisor refreshes /proc/meminfo only every so often, so the
	// snippet's last reading can lag what the watch saw by a few chunks on
	// a busy machine (it read 134 MiB once): the snippet paces itself, and
	// the bound lies between the two.
	res := runIn(t, root, "one", `
import time
chunks = []
while True:
    chunks.append(bytearray(8 << 20))
    time.sleep(0.005)
    avail = [l.split()[1] for l in open('/proc/meminfo') if l.startswith('MemAvailable:')][0]
    print(avail, flush=True)
`, "--timeout", "1m")
	lines := strings.Fields(res.stdout)
	if res.code != 137 || len(lines) == 0 {
		t.Fatalf("a growing snippet: exit %d, stdout %q, stderr %s; want killed for memory", res.code, res.stdout, res.stderr)
	}
	if kb, _ := strconv.Atoi(lines[len(lines)-1]); kb > 192<<10 {
		t.Errorf("MemAvailable was %d kB at the watch's kill, want at most 192 MiB of 512", kb)
	}

	// Resumed, it shows the same.
	mustFlmbox(t, root, "sandbox", "suspend", "one")
	if res := runIn(t, root, "one", showCode); res.code != 0 || res.stdout != "1 1 1 1 524288\n" {
		t.Fatalf("resumed, the sandbox shows %q, want %q; stderr %s", res.stdout, "1 1 1 1 524288\n", res.stderr)
	}
	if limit := readTrimmed(t, sandboxCgroupFile(t, root, "one", "memory", "memory.limit_in_bytes", "memory.max")); limit != strconv.Itoa(768<<20) {
		t.Errorf("resumed, the sandbox's memory cgroup allows %s, want %d", limit, 768<<20)
	}
}

// readTrimmed returns the contents of file without surrounding space.
func readTrimmed(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Clean(file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
