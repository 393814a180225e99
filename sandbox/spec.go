package sandbox

import (
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
)

// Spec is what a new sandbox is made of. Its zero fields take the defaults
// documented on each.
type Spec struct {
	// Name is the sandbox's name: 1 to 64 of [A-Za-z0-9_.-], starting with
	// a letter or digit. Default: "sb-" and 12 random hex digits.
	Name string
	// Image is the image to run: a reference rootfs.ParseReference takes.
	// It is pulled into the cache unless it is there already.
	Image string
	// Pull bounds and selects what a pull fetches (nil: rootfs's defaults).
	Pull *rootfs.PullOptions
	// Network is the sandbox's network. Default: NetworkNone.
	Network Network
	// Egress is where an egress sandbox (NetworkEgress) may connect:
	// nowhere if empty. Only for NetworkEgress.
	Egress Egress
	// Platform is gVisor's platform (systrap, ptrace, kvm). Default: runsc's.
	Platform string
	// LazySpares makes the agent start no spare process (a Python ready
	// for the next call, the zygote) before the first call of each
	// language, nor after a reset, nor once no call came for 30 seconds
	// (flmbox-agent --spares=lazy; snippet.DefaultSpareIdle): an idle
	// sandbox then costs about a bare runsc container's memory, and the
	// first call of each language pays for its interpreter's start (see
	// docs/ARCHITECTURE.md, "What an idle sandbox costs"). Part of a
	// pool's shape.
	LazySpares bool
	// Limits are the sandbox's limits; its zero fields take DefaultLimits'.
	Limits Limits
	// TmpBytes is the size of the sandbox's writable /tmp. Default:
	// DefaultTmpBytes.
	TmpBytes int64
	// Env are K=V settings added to the sandbox's environment, after the
	// image's and flmbox's; /tmp/site-packages stays first on PYTHONPATH.
	Env []string
	// Pip are pip requirements installed from the wheel cache when the
	// sandbox is created, as pip install does in a call (into the user
	// site, ~/.local/lib/pythonX.Y/site-packages; see flmboxEnv).
	Pip []string
	// Mounts are host directories (or files) bound into the sandbox,
	// read-only unless marked ReadWrite. A source that is the host's root,
	// under /proc, /sys or /dev, the state root or inside it, or a
	// directory that holds the state root, is refused.
	Mounts []Mount
	// Labels are the caller's own words about the sandbox (docker's
	// labels, E2B's metadata), to find its sandboxes again after a restart
	// (ListLabeled, sandbox ls --filter label=K=V): at most MaxLabels, each
	// key 1 to 128 of [A-Za-z0-9._/-], each value at most 1,024 bytes of
	// UTF-8 text. Not part of a pool's shape: an Acquire gives the sandbox
	// its holder's, a Release takes them away.
	Labels map[string]string
	// Ephemeral says that the sandbox belongs to the process that creates
	// it: Reconcile removes it once that process is gone. It is for a
	// caller that removes the sandbox itself when done and may be killed
	// first (RunOnce and Batch set it on the sandboxes they make).
	Ephemeral bool

	// fetch is FetchWheels' download directory, bound read-write at
	// fetchMount: inside the state root, which no Mount may be.
	fetch string
}

// Mount binds a host directory or file into a sandbox.
type Mount struct {
	// Source is the host path, absolute; Destination the path in the
	// sandbox.
	Source, Destination string
	// ReadWrite lets the sandbox write the source: snippets can then change
	// the host's files there. Default: read-only.
	ReadWrite bool
}

// mountJSON is a Mount as pools' settings and shape keys hold it, as they
// did before mounts were read-only by default: a key or a pool's settings
// never change with that.
type mountJSON struct {
	Source, Destination string
	ReadOnly            bool
}

// MarshalJSON writes m as pools' settings hold it.
func (m Mount) MarshalJSON() ([]byte, error) {
	return json.Marshal(mountJSON{Source: m.Source, Destination: m.Destination, ReadOnly: !m.ReadWrite})
}

// UnmarshalJSON reads m as pools' settings hold it.
func (m *Mount) UnmarshalJSON(b []byte) error {
	var j mountJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = Mount{Source: j.Source, Destination: j.Destination, ReadWrite: !j.ReadOnly}
	return nil
}

// DefaultLimits are a Spec's default limits.
var DefaultLimits = Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 256}

// DefaultTmpBytes is the default size of a sandbox's /tmp.
const DefaultTmpBytes = 256 << 20

// The smallest limits a sandbox gets; smaller ones are refused (Normalize),
// since runsc would fail or the sandbox would not survive what its snippets
// can do. docs/PERFORMANCE.md ("Limits' floors") has the measurements.
const (
	// MinMemoryBytes is the smallest Limits.MemoryBytes: below it, gVisor's
	// own memory and what snippets grow by before the memory watch kills
	// them no longer fit in the cgroup's headroom.
	MinMemoryBytes = 256 << 20
	// MinPids is the smallest Limits.Pids: gVisor's own threads count
	// against the host's pids cgroup.
	MinPids = 64
	// MinCPUs is the smallest Limits.CPUs: below it, a new sandbox takes
	// seconds to answer.
	MinCPUs = 0.1
	// MinTmpBytes is the smallest TmpBytes; less is taken for a mistake of
	// unit (--tmp-size 16).
	MinTmpBytes = 1 << 20
)

// checkLimits refuses limits below what a sandbox needs, saying which and
// the minimum, and limits this host cannot meet: more CPUs than it has, a
// /tmp larger than the memory limit (/tmp is a tmpfs: its files are the
// sandbox's memory).
func checkLimits(l Limits, tmpBytes int64) error {
	var bad []string
	if l.MemoryBytes < MinMemoryBytes {
		bad = append(bad, fmt.Sprintf("memory %d bytes is below the minimum of %d (%d MiB)", l.MemoryBytes, MinMemoryBytes, MinMemoryBytes>>20))
	}
	if l.Pids < MinPids {
		bad = append(bad, fmt.Sprintf("pids %d is below the minimum of %d (gVisor's own threads count)", l.Pids, MinPids))
	}
	if !(l.CPUs >= MinCPUs) { // NaN too
		bad = append(bad, fmt.Sprintf("cpus %g is below the minimum of %g", l.CPUs, MinCPUs))
	}
	if n := goruntime.NumCPU(); l.CPUs > float64(n) {
		bad = append(bad, fmt.Sprintf("cpus %g is more than this host's %d", l.CPUs, n))
	}
	if tmpBytes < MinTmpBytes {
		bad = append(bad, fmt.Sprintf("/tmp size %d bytes is below the minimum of %d (%d MiB)", tmpBytes, MinTmpBytes, MinTmpBytes>>20))
	}
	if tmpBytes > l.MemoryBytes && l.MemoryBytes >= MinMemoryBytes {
		bad = append(bad, fmt.Sprintf("/tmp size %d bytes is more than the memory limit of %d (/tmp is a tmpfs: its files are memory)", tmpBytes, l.MemoryBytes))
	}
	if len(bad) > 0 {
		return fmt.Errorf("sandbox limits: %s: %w", strings.Join(bad, "; "), errdefs.ErrInvalidArgument)
	}
	return nil
}

// Normalize returns s with its defaults filled in, or an error that names
// what is wrong with it (errdefs.ErrInvalidArgument): the one validation of
// a Spec, which Create, Acquire, RunOnce, Batch and FillPool make too. A
// front calls it where it reads a spec, to refuse one before it does
// anything else. It takes a spec without an Image (one that a caller
// completes later, as flmbox instance does with a session's); Create
// refuses it, and a mount that exposes the Manager's state root.
func (s Spec) Normalize() (Spec, error) { return s.normalize("") }

// withDefaults is Normalize for a spec about to be used: it needs an
// Image, and no mount may expose the state root.
func (s Spec) withDefaults(root string) (Spec, error) {
	if s.Image == "" {
		return s, fmt.Errorf("create sandbox: no image: %w", errdefs.ErrInvalidArgument)
	}
	return s.normalize(root)
}

// normalize is Normalize; no mount may expose root ("": not checked).
func (s Spec) normalize(root string) (Spec, error) {
	if s.Network == "" {
		s.Network = NetworkNone
	}
	if _, err := ParseNetwork(string(s.Network)); err != nil {
		return s, err
	}
	if err := normalizeEgress(s); err != nil {
		return s, err
	}
	if err := runtime.ValidatePlatform(s.Platform); err != nil {
		return s, err
	}
	if s.Pull != nil && s.Pull.Platform != (rootfs.Platform{}) {
		if host := rootfs.HostPlatform(); !s.Pull.Platform.RunsOn(host) {
			return s, fmt.Errorf("this worker runs %s; the image asked for is %s, which it cannot run (a prewarm may fetch another platform's image, a sandbox cannot run it): %w",
				host, s.Pull.Platform, errdefs.ErrInvalidArgument)
		}
	}
	if s.Limits.MemoryBytes == 0 {
		s.Limits.MemoryBytes = DefaultLimits.MemoryBytes
	}
	if s.Limits.CPUs == 0 {
		s.Limits.CPUs = DefaultLimits.CPUs
	}
	if s.Limits.Pids == 0 {
		s.Limits.Pids = DefaultLimits.Pids
	}
	if s.TmpBytes == 0 {
		s.TmpBytes = DefaultTmpBytes
	}
	if err := checkLimits(s.Limits, s.TmpBytes); err != nil {
		return s, err
	}
	for _, kv := range s.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return s, fmt.Errorf("environment setting %q: want K=V: %w", kv, errdefs.ErrInvalidArgument)
		}
	}
	if err := checkRequirements(s.Pip); err != nil {
		return s, err
	}
	if err := checkLabels(s.Labels); err != nil {
		return s, err
	}
	if err := checkMounts(s.Mounts, root); err != nil {
		return s, err
	}
	return s, nil
}

// MaxLabels bounds a sandbox's labels.
const MaxLabels = 64

// checkLabels refuses labels beyond what Spec.Labels says.
func checkLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%d labels: at most %d: %w", len(labels), MaxLabels, errdefs.ErrInvalidArgument)
	}
	for k, v := range labels {
		if k == "" || len(k) > 128 || strings.ContainsFunc(k, func(c rune) bool {
			return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._/-", c))
		}) {
			return fmt.Errorf("label key %q: want 1 to 128 of A-Z a-z 0-9 . _ / -: %w", k, errdefs.ErrInvalidArgument)
		}
		if len(v) > 1024 || !utf8.ValidString(v) || strings.ContainsFunc(v, func(c rune) bool { return c < ' ' || c == 0x7f }) {
			return fmt.Errorf("label %s: its value is not text of at most 1,024 bytes: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// HasLabels reports whether sb has every label of sel; an empty value in
// sel asks only that sb has the key.
func (sb *Sandbox) HasLabels(sel map[string]string) bool {
	for k, v := range sel {
		got, ok := sb.Labels[k]
		if !ok || v != "" && got != v {
			return false
		}
	}
	return true
}

// checkRequirements refuses what pip would not read as a requirement:
// options (a leading '-'), control characters, absurd lengths.
func checkRequirements(reqs []string) error {
	for _, r := range reqs {
		if r == "" || len(r) > 1000 || strings.HasPrefix(r, "-") || strings.ContainsFunc(r, func(c rune) bool { return c < ' ' || c == 0x7f }) {
			return fmt.Errorf("requirement %q: want a pip requirement such as NAME, NAME==VERSION or 'NAME>=1,<2': %w", r, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// flmboxEnv is what flmbox adds to the image's environment.
//
// pip installs as on any machine where a user cannot write the system's
// site-packages (here the root is read-only): for the user ("Defaulting to
// user installation because normal site-packages is not writeable"), into
// the user site, ~/.local/lib/pythonX.Y/site-packages with HOME=/tmp, which
// every Python of that version puts on sys.path once it exists, the agent's
// own too (see pythonUserSiteDef in package snippet). A user install sees
// what the image has: a requirement that the image's packages meet is not
// installed again. (PIP_TARGET=/tmp/site-packages, which flmbox set before,
// made pip ignore them, and refuse --user.) PIP_BREAK_SYSTEM_PACKAGES lets
// pip past the image's PEP 668 mark (EXTERNALLY-MANAGED), which is there to
// keep pip out of the system's packages, which it cannot touch here; inside
// a virtual environment pip honours neither and installs into it.
var flmboxEnv = []string{
	"PIP_BREAK_SYSTEM_PACKAGES=1",
	"PIP_CACHE_DIR=/tmp/.cache/pip",
	"HOME=/tmp",
	"LANG=C.UTF-8",
}

// sitePackages is first on every sandbox's PYTHONPATH: what is put there
// (pip install --target /tmp/site-packages) imports in every call.
const sitePackages = "/tmp/site-packages"

// DefaultPath is the PATH of a sandbox whose image sets none: docker's.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Environment is a sandbox's environment: the image's (with DefaultPath if
// it sets no PATH, as docker does), then flmbox's, then extra (pip's
// settings, the caller's); later entries win. PYTHONPATH is
// /tmp/site-packages, followed by the last PYTHONPATH that the caller or
// else the image sets, so that what pip installs always imports.
func Environment(image, extra []string) []string {
	pythonpath := withSitePackages("")
	var env []string
	base := append([]string{}, image...)
	if !slices.ContainsFunc(image, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		base = append([]string{"PATH=" + DefaultPath}, base...)
	}
	for _, kv := range append(base, flmboxEnv...) {
		if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			if v != "" {
				pythonpath = withSitePackages(v)
			}
			continue
		}
		env = append(env, kv)
	}
	var rest []string
	for _, kv := range extra {
		if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			pythonpath = withSitePackages(v)
			continue
		}
		rest = append(rest, kv)
	}
	env = append(env, "PYTHONPATH="+pythonpath)
	return append(env, rest...)
}

// withSitePackages is the PYTHONPATH value path with /tmp/site-packages
// first.
func withSitePackages(path string) string {
	if path == "" {
		return sitePackages
	}
	return sitePackages + ":" + path
}
