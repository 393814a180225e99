package bench

import (
	"encoding/json"
	"io"
	"math"
	"slices"
	"time"

	"github.com/flmbox/flmbox/sandbox"
)

// Report is what Run measured; its JSON form (WriteJSON) is `flmbox bench
// --json`'s object. Keys may be added; those there keep their meaning
// (a section added later is zero or null in reports made before it). Times are milliseconds unless a key says otherwise (_s:
// seconds, _kib: KiB).
type Report struct {
	Allocation Allocation `json:"allocation"`
	// Warm has one entry per API (sandbox, batch) and language (python,
	// shell), in that order: sandbox/python, batch/python, sandbox/shell,
	// batch/shell.
	Warm    []Warm  `json:"warm"`
	Batch   Batch   `json:"batch"`
	Prewarm Prewarm `json:"prewarm"`
	Memory  Memory  `json:"memory"`
	// Pool is an idle pooled sandbox's memory.
	Pool PoolMemory `json:"pool"`
	// Copy is flmbox cp of 100 MiB in and out.
	Copy Copy `json:"copy"`
	// Suspend is flmbox sandbox suspend and the resume of a call.
	Suspend Suspend `json:"suspend"`
	// Instance is `flmbox instance` driven as Flame's executor drives it.
	Instance Instance `json:"instance"`
	// Callback is a callback round trip from inside a sandbox.
	Callback Callback `json:"callback"`
	// Records is Manager.Get, List and Probe in process.
	Records Records `json:"records"`
	// Egress is --network egress against --network none and the host's
	// own network stack.
	Egress Egress `json:"egress"`
	// Long is code that runs for seconds, as a call, by runsc exec in
	// the same sandbox and in bare runsc.
	Long  Long  `json:"long"`
	Runsc Runsc `json:"runsc"`
	// Density is idle sandboxes made one after another, measured as
	// their count grows (absent without Options.Density).
	Density *Density `json:"density,omitempty"`
	// Image is what was measured; Settings how often.
	Image    Image    `json:"image"`
	Settings Settings `json:"settings"`
}

// Stats summarizes measurements in milliseconds.
type Stats struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// RoundStats summarizes measurements taken in rounds, in milliseconds: a
// Stats whose Median is the median of the rounds' medians, with P95 the
// median of the rounds' p95s; Min, Max and N are of all the measurements.
type RoundStats struct {
	Stats
	P95 float64 `json:"p95"`
}

// Allocation is a new sandbox until its first result is back.
type Allocation struct {
	// FreshMS is a whole `flmbox run --image` process, from its start until
	// its output is back.
	FreshMS Stats `json:"fresh_ms"`
	// RetainedMS is a new logical sandbox on a running gVisor sandbox: a
	// whole `flmbox run --sandbox NAME --reset` process. Run always sets
	// it; the schema allows null (no such path).
	RetainedMS *Stats `json:"retained_ms"`
	// RawRunscMS is runsc create + start + exec of the same snippet.
	RawRunscMS Stats `json:"raw_runsc_ms"`
	// FreshInprocessMS is the same as FreshMS through the Go API, in this
	// process (sandbox.Manager's Create, then Call): no CLI start-up, and
	// removal is not counted.
	FreshInprocessMS Stats `json:"fresh_inprocess_ms"`
	// PooledMS is a whole `flmbox run --image` process that adopts a clean
	// sandbox from a warm pool (flmbox pool fill), until its output is back;
	// PooledReleaseMS is the rest of that process, from its output until it
	// exits: the reset that puts the sandbox back into the pool (null in
	// reports made before pools).
	PooledMS        *Stats `json:"pooled_ms"`
	PooledReleaseMS *Stats `json:"pooled_release_ms"`
}

// Records is what describing sandboxes costs in process: Manager.Get of
// one running sandbox (GetMS) and Manager.List of Sandboxes running ones
// (ListMS), which read records and run nothing, and Manager.Probe of those
// (ProbeMS), which pings each agent, all at once.
type Records struct {
	Sandboxes int   `json:"sandboxes"`
	GetMS     Stats `json:"get_ms"`
	ListMS    Stats `json:"list_ms"`
	ProbeMS   Stats `json:"probe_ms"`
}

// Egress is --network egress, measured in two network namespaces the bench
// makes and removes: "worker", where every flmbox process and host python3
// of these figures runs (nsenter --net), and "world", worker's only way
// out, the internet: a server of the bench's process on 198.51.100.10:80.
type Egress struct {
	// FirstResultMS is a whole `flmbox run --image --network egress
	// --allow 198.51.100.10` process until its output is back;
	// NoneFirstResultMS the same with --network none, its baseline,
	// measured alternately, pair by pair.
	FirstResultMS     Stats `json:"first_result_ms"`
	NoneFirstResultMS Stats `json:"none_first_result_ms"`
	// DownloadBytes are downloaded over HTTP from world's server, timed by
	// the Python code itself (perf_counter around the request and every
	// read): in a persistent egress sandbox (DownloadMS), in the host's
	// python3 in worker, on the host's network stack (HostDownloadMS, the
	// baseline), and in a --network host sandbox in worker, gVisor passing
	// the host's stack through (HostNetworkDownloadMS), in rotating order.
	DownloadBytes         int64 `json:"download_bytes"`
	DownloadMS            Stats `json:"download_ms"`
	HostDownloadMS        Stats `json:"host_download_ms"`
	HostNetworkDownloadMS Stats `json:"host_network_download_ms"`
	// DownloadMiBps, HostDownloadMiBps and HostNetworkDownloadMiBps are
	// DownloadBytes over the median times, in MiB/s.
	DownloadMiBps            float64 `json:"download_mib_per_s"`
	HostDownloadMiBps        float64 `json:"host_download_mib_per_s"`
	HostNetworkDownloadMiBps float64 `json:"host_network_download_mib_per_s"`
	// ConnectMS is a TCP connect to world's server and its close, timed
	// by the Python code itself (perf_counter_ns), Connects of them in
	// Runs runs, each run after a few connects that are not measured; on
	// the same three sides as the downloads, in rotating order.
	ConnectMS            RoundStats `json:"connect_ms"`
	HostConnectMS        RoundStats `json:"host_connect_ms"`
	HostNetworkConnectMS RoundStats `json:"host_network_connect_ms"`
	Connects             int        `json:"connects"`
	Runs                 int        `json:"runs"`
}

// Copy is whole `flmbox cp` processes carrying a directory with one file
// of Bytes random bytes into a sandbox's /tmp (InMS) and back out (OutMS),
// against `tar -c | tar -x` of the same directory on the host (HostTarMS).
type Copy struct {
	Bytes     int64 `json:"bytes"`
	InMS      Stats `json:"in_ms"`
	OutMS     Stats `json:"out_ms"`
	HostTarMS Stats `json:"host_tar_ms"`
}

// Suspend is a sandbox with TmpBytes in /tmp: whole `flmbox sandbox
// suspend` processes (SuspendMS) and `flmbox run --sandbox` processes that
// resume it, until their output (ResumeFirstResultMS), against runsc
// checkpoint of a bare container with the same /tmp (RawCheckpointMS) and
// its runsc restore + exec until the same output (RawRestoreFirstResultMS).
// ImageBytes is the sandbox's checkpoint image; SuspendedProcesses the most
// host processes a suspended sandbox had left (0: none).
type Suspend struct {
	TmpBytes                int64 `json:"tmp_bytes"`
	SuspendMS               Stats `json:"suspend_ms"`
	ResumeFirstResultMS     Stats `json:"resume_first_result_ms"`
	RawCheckpointMS         Stats `json:"raw_checkpoint_ms"`
	RawRestoreFirstResultMS Stats `json:"raw_restore_first_result_ms"`
	// FreshFirstResultMS is `flmbox run --image` until its first result,
	// measured in the same rounds as the resumes (added when the
	// allocation pairs' figure, measured minutes apart, swung the ratio).
	FreshFirstResultMS Stats `json:"fresh_first_result_ms"`
	ImageBytes         int64 `json:"image_bytes"`
	SuspendedProcesses int   `json:"suspended_processes"`
}

// PoolMemory is the host memory (PSS and RSS, in KiB) of idle pooled
// sandboxes that have served a call and been reset, with flmbox's default
// spares and with lazy ones, and of a bare runsc container running sleep,
// all three alive at once and measured side by side.
type PoolMemory struct {
	IdleKiB        int64 `json:"idle_kib"`
	IdleRSSKiB     int64 `json:"idle_rss_kib"`
	Processes      int   `json:"processes"`
	LazyIdleKiB    int64 `json:"lazy_idle_kib"`
	LazyIdleRSSKiB int64 `json:"lazy_idle_rss_kib"`
	LazyProcesses  int   `json:"lazy_processes"`
	BareKiB        int64 `json:"bare_runsc_kib"`
	BareRSSKiB     int64 `json:"bare_runsc_rss_kib"`
	BareProcesses  int   `json:"bare_runsc_processes"`
}

// Warm is one API and language of warm calls: medians and p95s are the
// medians of the within-round medians and p95s.
type Warm struct {
	API      string `json:"api"`      // sandbox or batch
	Language string `json:"language"` // python or shell
	// MedianMS and P95MS: whole `flmbox run --sandbox` processes, or
	// `flmbox run --batch --sandbox` of one snippet.
	MedianMS float64 `json:"median_ms"`
	P95MS    float64 `json:"p95_ms"`
	// Inprocess: the Go API in this process (sandbox.Manager.Call for
	// sandbox, Manager.Batch of one snippet for batch).
	InprocessMedianMS float64 `json:"inprocess_median_ms"`
	InprocessP95MS    float64 `json:"inprocess_p95_ms"`
	// RunscExec: runsc exec of the same command in the same sandbox.
	RunscExecMedianMS float64 `json:"runsc_exec_median_ms"`
	RunscExecP95MS    float64 `json:"runsc_exec_p95_ms"`
	// Native: the same command under chroot ROOTFS on the host.
	NativeMedianMS float64 `json:"native_median_ms"`
	NativeP95MS    float64 `json:"native_p95_ms"`
	// Calls is the number of measured calls of each kind.
	Calls int `json:"calls"`
}

// Instance is `flmbox instance`, flmbox as a Flame application, driven as
// Flame's executor manager drives one (package flamesim: the process in a
// group of its own, its socket, gRPC calls over it from this process).
type Instance struct {
	// EnterFirstResultMS is a new `flmbox instance --image` process until
	// its first task's result is back: from the process's start through
	// its socket accepting connections, OnSessionEnter (which creates the
	// session's sandbox) and OnTaskInvoke of the snippet FreshMS runs.
	// Stopping it (SIGTERM; it leaves the session) is not counted.
	EnterFirstResultMS Stats `json:"enter_first_result_ms"`
	// SocketMS is the part of it until the socket accepts connections,
	// EnterMS the OnSessionEnter call.
	SocketMS Stats `json:"socket_ms"`
	EnterMS  Stats `json:"enter_ms"`
	// FreshMS is a whole `flmbox run --image` process, as
	// Allocation.FreshMS, measured alternately with EnterFirstResultMS,
	// pair by pair: its baseline.
	FreshMS Stats `json:"fresh_ms"`
	// Warm has one entry per language (python, shell), in that order.
	Warm []InstanceWarm `json:"warm"`
}

// InstanceWarm is warm tasks of one language in one session of one
// instance, against warm calls on a sandbox of the same spec, measured
// alternately as Warm's: medians and p95s are the medians of the
// within-round medians and p95s.
type InstanceWarm struct {
	Language string `json:"language"` // python or shell
	// MedianMS and P95MS: OnTaskInvoke, from the call until its result
	// is back.
	MedianMS float64 `json:"median_ms"`
	P95MS    float64 `json:"p95_ms"`
	// CLIMedianMS and CLIP95MS: whole `flmbox run --sandbox` processes.
	CLIMedianMS float64 `json:"cli_median_ms"`
	CLIP95MS    float64 `json:"cli_p95_ms"`
	// Calls is the number of measured calls of each kind.
	Calls int `json:"calls"`
}

// Callback is a callback's round trip from inside a sandbox:
// connect to $FLMBOX_CALLBACK_SOCKET, send a 1 KiB request, read a 1 KiB
// answer, close, timed by the Python client itself (perf_counter_ns), on a
// server in the bench's process that answers each connection and closes
// it. Each run makes a few round trips that are not measured first. Runs
// inside and on the host alternate (inside, host, host, inside, …).
type Callback struct {
	// InsideMS: calls through the Go API (sandbox.Manager.Call, with a
	// sandbox.Callback whose Dial connects to the server) in a sandbox of
	// the bench's spec, each call a run; the path measured is the
	// agent's, its host connection and the server.
	InsideMS RoundStats `json:"inside_ms"`
	// HostMS: the same Python code in a python3 process on the host (its
	// own interpreter, not the image's), on the server's socket directly.
	HostMS RoundStats `json:"host_ms"`
	// AddedMS is what flmbox's forwarding adds to a round trip:
	// InsideMS.Median - HostMS.Median.
	AddedMS float64 `json:"added_ms"`
	// RoundTrips is the number of measured round trips of each side, in
	// Runs runs of each.
	RoundTrips int `json:"round_trips"`
	Runs       int `json:"runs"`
}

// Batch is the throughput of one `flmbox run --batch --image`.
type Batch struct {
	Snippets  int     `json:"snippets"`
	Parallel  int     `json:"parallel"` // the default --parallel
	SerialS   float64 `json:"serial_s"` // --parallel 1
	ParallelS float64 `json:"parallel_s"`
	// SnippetNativeS is what one snippet takes under chroot on the host.
	SnippetNativeS float64 `json:"snippet_native_s"`
}

// Prewarm is whole `flmbox prewarm` processes.
type Prewarm struct {
	// ColdMS is the median of cold prewarms from a loopback registry.
	ColdMS float64 `json:"cold_ms"`
	// CraneTarMS is the median of crane export | tar -x of the same image
	// from the same registry; nil (null) without crane on PATH.
	CraneTarMS *float64 `json:"crane_tar_ms"`
	// HitMS is the median of cache-hit prewarms by index digest, with the
	// registry stopped.
	HitMS    float64 `json:"hit_ms"`
	Cold     Stats   `json:"cold_stats"`
	CraneTar *Stats  `json:"crane_tar_stats"`
	Hit      Stats   `json:"hit_stats"`
	// Big is the big image's section (Options.BigImage); nil without it.
	Big *BigPrewarm `json:"big,omitempty"`
}

// Memory is host memory of all the host processes of one idle sandbox:
// sandbox_kib and bare_runsc_kib are PSS (shared pages split among their
// users); RSS is reported too. The sandbox_ keys are the first of Modes.
type Memory struct {
	SandboxKiB         int64 `json:"sandbox_kib"`
	BareRunscKiB       int64 `json:"bare_runsc_kib"`
	SandboxRSSKiB      int64 `json:"sandbox_rss_kib"`
	BareRunscRSSKiB    int64 `json:"bare_runsc_rss_kib"`
	SandboxProcesses   int   `json:"sandbox_processes"`
	BareRunscProcesses int   `json:"bare_runsc_processes"`
	// Modes are sandboxes whose agents start their spare processes in
	// different ways, measured one after the other.
	Modes []MemoryMode `json:"modes"`
}

// MemoryMode is one sandbox measured idle after its creation (PSS and RSS,
// KiB), then its first Python and shell calls, warm calls of each (in
// process, Stats of Settings.Calls each), and idle again after them.
type MemoryMode struct {
	Spares        string  `json:"spares"` // "default", or the mode of the agent's spares
	KiB           int64   `json:"kib"`
	RSSKiB        int64   `json:"rss_kib"`
	Processes     int     `json:"processes"`
	FirstPythonMS float64 `json:"first_python_ms"`
	FirstShellMS  float64 `json:"first_shell_ms"`
	WarmPythonMS  Stats   `json:"warm_python_ms"`
	WarmShellMS   Stats   `json:"warm_shell_ms"`
	UsedKiB       int64   `json:"used_kib"`
	UsedRSSKiB    int64   `json:"used_rss_kib"`
	UsedProcesses int     `json:"used_processes"`
}

// Runsc is the runsc measured: its path, version and gVisor platform.
type Runsc struct {
	Path     string `json:"path"`
	Version  string `json:"version"`
	Platform string `json:"platform"`
}

// Density is the density section: its series, default spares, lazy spares
// and suspended, in that order, and the host limits read before.
type Density struct {
	// Sandboxes is Options.Density (N), Suspended DensitySuspended (M).
	Sandboxes int             `json:"sandboxes"`
	Suspended int             `json:"suspended"`
	Limits    DensityLimits   `json:"limits"`
	Series    []DensitySeries `json:"series"`
}

// DensityLimits are the host's limits on the count, read before the bench
// made anything (sandbox.HostLimits), and the counts they allow.
type DensityLimits struct {
	Limits []sandbox.HostLimit `json:"limits"`
	// MaxSandboxes is the most running sandboxes the limits allow, less
	// what the bench leaves to everyone else (1 GiB of memory), and
	// CappedBy the limit that sets it, in words; MaxSuspended the most
	// suspended ones the free disk allows (8 MiB each).
	MaxSandboxes  int    `json:"max_sandboxes"`
	CappedBy      string `json:"capped_by"`
	DiskFreeBytes int64  `json:"disk_free_bytes"`
	MaxSuspended  int    `json:"max_suspended"`
}

// DensitySeries is one series: its points, in the order of their counts,
// the all-answering check at its end, and its removals.
type DensitySeries struct {
	// Name is "default", "lazy" (Spec.LazySpares) or "suspended".
	Name   string         `json:"name"`
	Points []DensityPoint `json:"points"`
	// Checked sandboxes were called at the end of the series (a suspended
	// one resumed first); NotAnswering of them failed, the first failure
	// in FirstFailure.
	Checked      int    `json:"checked"`
	NotAnswering int    `json:"not_answering"`
	FirstFailure string `json:"first_failure,omitempty"`
	// RemoveMS is Manager.Remove of each sandbox at the end (of the
	// suspended series: each resumed, called and removed).
	RemoveMS Stats `json:"remove_ms"`
}

// DensityPoint is what a series measured with Sandboxes of its sandboxes
// alive (suspended, in the suspended series). Stats of KiB are per
// sandbox, of the bench's sandboxes; host-wide figures include whatever
// else runs.
type DensityPoint struct {
	Sandboxes int `json:"sandboxes"`
	// MemAvailableDropKiB is how far /proc/meminfo's MemAvailable fell
	// since before the series' first sandbox; MemPerSandboxKiB that drop
	// divided by Sandboxes.
	MemAvailableDropKiB int64 `json:"mem_available_drop_kib"`
	MemPerSandboxKiB    int64 `json:"mem_per_sandbox_kib"`
	// PSSPerSandboxKiB is the PSS of all their host processes (runsc-gofer,
	// runsc-sandbox and its children, each address space once) divided by
	// Sandboxes; PSSKiB of each sandbox's.
	PSSPerSandboxKiB int64 `json:"pss_per_sandbox_kib"`
	PSSKiB           Stats `json:"pss_kib"`
	// CgroupPerSandboxKiB is the memory charged to their cgroups
	// (Sandbox.HostMemory's Charged: runsc makes one a sandbox, which
	// counts the page cache they brought in too) divided by Sandboxes; 0 if
	// they have no cgroup of their own.
	CgroupPerSandboxKiB int64 `json:"cgroup_per_sandbox_kib"`
	// Host processes, tasks (threads: each takes a pid) and open file
	// descriptors (each table once) of their processes, per sandbox.
	ProcessesPerSandbox float64 `json:"processes_per_sandbox"`
	TasksPerSandbox     float64 `json:"tasks_per_sandbox"`
	FDsPerSandbox       float64 `json:"fds_per_sandbox"`
	// CreateMS is Manager.Create of the sandboxes made since the previous
	// point; SuspendMS (suspended series) Manager.Suspend of each.
	CreateMS  Stats  `json:"create_ms"`
	SuspendMS *Stats `json:"suspend_ms,omitempty"`
	// ListMS is Manager.List in process; CLIListMS a whole `flmbox sandbox
	// ls --json`, as a user runs it.
	ListMS    Stats `json:"list_ms"`
	CLIListMS Stats `json:"cli_list_ms"`
	// FirstCallMS is the first call (Manager.Call, shell echo) of a few
	// random sandboxes since the point before; CallMS their next calls,
	// warm; CLICallMS whole `flmbox run --sandbox` processes on them.
	// Running series only.
	FirstCallMS *Stats `json:"first_call_ms,omitempty"`
	CallMS      *Stats `json:"call_ms,omitempty"`
	CLICallMS   *Stats `json:"cli_call_ms,omitempty"`
	// ResumeMS is Manager.Resume + Manager.Call of a random suspended
	// sandbox, CLIResumeMS a whole `flmbox run --sandbox` of one (which
	// resumes it) until its result; each suspended again after.
	// Suspended series only.
	ResumeMS    *Stats `json:"resume_ms,omitempty"`
	CLIResumeMS *Stats `json:"cli_resume_ms,omitempty"`
	// DiskPerSandboxBytes is the disk the sandboxes' directories take (du)
	// divided by Sandboxes, ImageBytes the median checkpoint image
	// (Sandbox.ImageBytes). Suspended series only.
	DiskPerSandboxBytes int64 `json:"disk_per_sandbox_bytes,omitempty"`
	ImageBytes          int64 `json:"image_bytes,omitempty"`
	// HostCPUPercent is the host's busy time over a few idle seconds, in %
	// of all its CPUs (/proc/stat); SandboxCPUPercent the part of the
	// bench's sandboxes' processes.
	HostCPUPercent    float64 `json:"host_cpu_percent"`
	SandboxCPUPercent float64 `json:"sandbox_cpu_percent"`
}

// Image is the image measured: as given (or picked), and what it resolved
// to on this worker.
type Image struct {
	Ref            string `json:"ref"`
	IndexDigest    string `json:"index_digest"`
	ManifestDigest string `json:"manifest_digest"`
	Platform       string `json:"platform"`
	SizeBytes      int64  `json:"size_bytes"`
}

// Settings are the Options the figures were measured with, and the CPUs
// of the machine.
type Settings struct {
	Pairs         int     `json:"pairs"`
	Warmup        int     `json:"warmup"`
	Rounds        int     `json:"rounds"`
	Calls         int     `json:"calls"`
	PauseMS       float64 `json:"pause_ms"` // before each warm call; 0: back to back
	PrewarmRounds int     `json:"prewarm_rounds"`
	CPUs          int     `json:"cpus"`
	// DensityOnly: the density section was measured alone; the other
	// sections' figures are zero.
	DensityOnly bool `json:"density_only,omitempty"`
	// LongOnly: the long calls were measured alone; the other sections'
	// figures are zero.
	LongOnly bool `json:"long_only,omitempty"`
}

// WriteJSON writes the report as one line of JSON (`flmbox bench --json`).
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(rep)
}

// ms converts a duration to milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// summarize returns the median, min, max and count of xs (ms).
func summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := slices.Sorted(slices.Values(xs))
	return Stats{Median: median(s), Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// summarizeRounds returns the RoundStats of rounds (ms).
func summarizeRounds(rounds [][]float64) RoundStats {
	s := summarize(slices.Concat(rounds...))
	if s.N == 0 {
		return RoundStats{}
	}
	var p float64
	s.Median, p = roundSummary(rounds)
	return RoundStats{Stats: s, P95: p}
}

// median of sorted values: the mean of the middle two for an even count.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// p95 of sorted values, by nearest rank: the smallest value at or above
// which 95% of the values lie.
func p95(sorted []float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[int(math.Ceil(0.95*float64(len(sorted))))-1]
}

// roundSummary is the median of the within-round medians and the median of
// the within-round p95s.
func roundSummary(rounds [][]float64) (med, p float64) {
	var meds, ps []float64
	for _, r := range rounds {
		s := slices.Sorted(slices.Values(r))
		meds, ps = append(meds, median(s)), append(ps, p95(s))
	}
	slices.Sort(meds)
	slices.Sort(ps)
	return median(meds), median(ps)
}
