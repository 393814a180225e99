package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestStats(t *testing.T) {
	for _, tc := range []struct {
		in      []float64
		want    Stats
		wantP95 float64
	}{
		{in: []float64{3, 1, 2}, want: Stats{Median: 2, Min: 1, Max: 3, N: 3}, wantP95: 3},
		{in: []float64{4, 1, 3, 2}, want: Stats{Median: 2.5, Min: 1, Max: 4, N: 4}, wantP95: 4},
		{in: []float64{7}, want: Stats{Median: 7, Min: 7, Max: 7, N: 1}, wantP95: 7},
	} {
		if got := summarize(tc.in); got != tc.want {
			t.Errorf("summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
		if got := p95(slices.Sorted(slices.Values(tc.in))); got != tc.wantP95 {
			t.Errorf("p95(%v) = %v, want %v", tc.in, got, tc.wantP95)
		}
	}
	// p95 by nearest rank: of 1..100 it is 95, of 1..20 it is 19.
	var hundred, twenty []float64
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, float64(i))
		if i <= 20 {
			twenty = append(twenty, float64(i))
		}
	}
	if got := p95(hundred); got != 95 {
		t.Errorf("p95(1..100) = %v", got)
	}
	if got := p95(twenty); got != 19 {
		t.Errorf("p95(1..20) = %v", got)
	}
	// Medians and p95s within rounds, then their medians.
	med, p := roundSummary([][]float64{{1, 2, 3, 100}, {2, 3, 4, 5}, {10, 3, 4, 5}})
	if med != 3.5 || p != 10 {
		t.Errorf("roundSummary: median %v, p95 %v; want 3.5 and 10", med, p)
	}
	if got := summarize(nil); got != (Stats{}) {
		t.Errorf("summarize(nil) = %+v", got)
	}
	// Of rounds: medians of the rounds' medians and p95s, min, max and N of all.
	want := RoundStats{Stats: Stats{Median: 3.5, Min: 1, Max: 100, N: 12}, P95: 10}
	if got := summarizeRounds([][]float64{{1, 2, 3, 100}, {2, 3, 4, 5}, {10, 3, 4, 5}}); got != want {
		t.Errorf("summarizeRounds = %+v, want %+v", got, want)
	}
	if got := summarizeRounds(nil); got != (RoundStats{}) {
		t.Errorf("summarizeRounds(nil) = %+v", got)
	}
	if got := ms(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("ms = %v", got)
	}
}

// sampleReport is a report as a run fills it.
func sampleReport(retained bool, crane bool) *Report {
	s := func(m float64) Stats { return Stats{Median: m, Min: m - 1, Max: m + 1, N: 3} }
	rep := &Report{
		Allocation: Allocation{FreshMS: s(170), RawRunscMS: s(120), FreshInprocessMS: s(140)},
		Batch:      Batch{Snippets: 64, Parallel: 2, SerialS: 40, ParallelS: 21, SnippetNativeS: 0.2},
		Prewarm:    Prewarm{ColdMS: 1100, HitMS: 3, Cold: s(1100), Hit: s(3)},
		Memory: Memory{SandboxKiB: 60000, BareRunscKiB: 30000, SandboxRSSKiB: 120000, BareRunscRSSKiB: 65000, SandboxProcesses: 9, BareRunscProcesses: 6,
			Modes: []MemoryMode{{Spares: "default", KiB: 60000, RSSKiB: 120000, Processes: 9, FirstPythonMS: 30, FirstShellMS: 20,
				WarmPythonMS: Stats{12, 10, 20, 50}, WarmShellMS: Stats{6, 5, 9, 50}, UsedKiB: 70000, UsedRSSKiB: 130000, UsedProcesses: 11}}},
		Runsc:    Runsc{Path: "/usr/local/bin/runsc", Version: "v1", Platform: "systrap"},
		Image:    Image{Ref: "oci-layout:/x@sha256:1", Platform: "linux/amd64", SizeBytes: 1 << 20},
		Settings: Settings{Pairs: 3, Warmup: 2, Rounds: 2, Calls: 10, PrewarmRounds: 2, CPUs: 2},
		Instance: Instance{EnterFirstResultMS: s(250), SocketMS: s(12), EnterMS: s(180), FreshMS: s(160),
			Warm: []InstanceWarm{{Language: "python", MedianMS: 14, P95MS: 20, CLIMedianMS: 16, CLIP95MS: 25, Calls: 20},
				{Language: "shell", MedianMS: 6, P95MS: 9, CLIMedianMS: 8, CLIP95MS: 12, Calls: 20}}},
		Callback: Callback{InsideMS: RoundStats{Stats: Stats{Median: 0.42, Min: 0.3, Max: 2.5, N: 100}, P95: 0.9},
			HostMS: RoundStats{Stats: Stats{Median: 0.06, Min: 0.04, Max: 0.3, N: 100}, P95: 0.1}, AddedMS: 0.36, RoundTrips: 100, Runs: 2},
		Egress: Egress{FirstResultMS: s(230), NoneFirstResultMS: s(200), DownloadBytes: 100 << 20,
			DownloadMS: s(400), HostDownloadMS: s(100), HostNetworkDownloadMS: s(200),
			DownloadMiBps: 250, HostDownloadMiBps: 1000, HostNetworkDownloadMiBps: 500,
			ConnectMS:            RoundStats{Stats: Stats{Median: 0.3, Min: 0.2, Max: 1.5, N: 100}, P95: 0.6},
			HostConnectMS:        RoundStats{Stats: Stats{Median: 0.05, Min: 0.04, Max: 0.2, N: 100}, P95: 0.08},
			HostNetworkConnectMS: RoundStats{Stats: Stats{Median: 0.2, Min: 0.1, Max: 0.9, N: 100}, P95: 0.4},
			Connects:             100, Runs: 2},
	}
	for _, api := range []string{"sandbox", "batch"} {
		for _, lang := range []string{"python", "shell"} {
			rep.Warm = append(rep.Warm, Warm{API: api, Language: lang, MedianMS: 19, P95MS: 29, InprocessMedianMS: 16,
				RunscExecMedianMS: 26, NativeMedianMS: 14, Calls: 20})
		}
	}
	if retained {
		r := s(80)
		rep.Allocation.RetainedMS = &r
	}
	if crane {
		c := s(1400)
		rep.Prewarm.CraneTar, rep.Prewarm.CraneTarMS = &c, &c.Median
	}
	return rep
}

// TestJSONSchema checks the report's schema: every key, its type, and null
// exactly where the issue allows it.
func TestJSONSchema(t *testing.T) {
	for _, tc := range []struct{ retained, crane bool }{{false, true}, {true, false}} {
		t.Run(fmt.Sprintf("retained=%t,crane=%t", tc.retained, tc.crane), func(t *testing.T) {
			var buf bytes.Buffer
			if err := sampleReport(tc.retained, tc.crane).WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(strings.TrimSpace(buf.String()), "\n"); n != 0 {
				t.Fatalf("want one JSON line, got %d more", n)
			}
			var obj map[string]any
			dec := json.NewDecoder(&buf)
			dec.UseNumber()
			if err := dec.Decode(&obj); err != nil {
				t.Fatal(err)
			}
			if err := validateJSON(obj, tc.retained, tc.crane); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestJSONKeys pins every key of the JSON object, so that renaming a Go
// field cannot change the schema unnoticed.
func TestJSONKeys(t *testing.T) {
	data, err := json.Marshal(sampleReport(true, true))
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"allocation": {"fresh_inprocess_ms", "fresh_ms", "pooled_ms", "pooled_release_ms", "raw_runsc_ms", "retained_ms"},
		"pool": {"bare_runsc_kib", "bare_runsc_processes", "bare_runsc_rss_kib", "idle_kib", "idle_rss_kib", "lazy_idle_kib",
			"lazy_idle_rss_kib", "lazy_processes", "processes"},
		"copy": {"bytes", "host_tar_ms", "in_ms", "out_ms"},
		"suspend": {"fresh_first_result_ms", "image_bytes", "raw_checkpoint_ms", "raw_restore_first_result_ms", "resume_first_result_ms", "suspend_ms",
			"suspended_processes", "tmp_bytes"},
		"batch":   {"parallel", "parallel_s", "serial_s", "snippet_native_s", "snippets"},
		"prewarm": {"cold_ms", "cold_stats", "crane_tar_ms", "crane_tar_stats", "hit_ms", "hit_stats"},
		"memory":  {"bare_runsc_kib", "bare_runsc_processes", "bare_runsc_rss_kib", "modes", "sandbox_kib", "sandbox_processes", "sandbox_rss_kib"},
		"memory.modes[0]": {"first_python_ms", "first_shell_ms", "kib", "processes", "rss_kib", "spares", "used_kib", "used_processes",
			"used_rss_kib", "warm_python_ms", "warm_shell_ms"},
		"runsc":    {"path", "platform", "version"},
		"image":    {"index_digest", "manifest_digest", "platform", "ref", "size_bytes"},
		"settings": {"calls", "cpus", "pairs", "pause_ms", "prewarm_rounds", "rounds", "warmup"},
		"warm[0]": {"api", "calls", "inprocess_median_ms", "inprocess_p95_ms", "language", "median_ms", "native_median_ms",
			"native_p95_ms", "p95_ms", "runsc_exec_median_ms", "runsc_exec_p95_ms"},
		"allocation.fresh_ms": {"max", "median", "min", "n"},
		"instance":            {"enter_first_result_ms", "enter_ms", "fresh_ms", "socket_ms", "warm"},
		"instance.warm[0]":    {"calls", "cli_median_ms", "cli_p95_ms", "language", "median_ms", "p95_ms"},
		"callback":            {"added_ms", "host_ms", "inside_ms", "round_trips", "runs"},
		"callback.inside_ms":  {"max", "median", "min", "n", "p95"},
		"records":             {"get_ms", "list_ms", "probe_ms", "sandboxes"},
		"egress": {"connect_ms", "connects", "download_bytes", "download_mib_per_s", "download_ms", "first_result_ms",
			"host_connect_ms", "host_download_mib_per_s", "host_download_ms", "host_network_connect_ms",
			"host_network_download_mib_per_s", "host_network_download_ms", "none_first_result_ms", "runs"},
		"egress.connect_ms": {"max", "median", "min", "n", "p95"},
		"long":              {"python"},
		"long.python":       {"bare_cpus", "bare_runsc_ms", "cpus", "flmbox_ms", "runsc_exec_ms", "work"},
	}
	keys := func(v any) []string {
		m, _ := v.(map[string]any)
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	if got := keys(obj); !slices.Equal(got, []string{"allocation", "batch", "callback", "copy", "egress", "image", "instance", "long", "memory", "pool", "prewarm", "records", "runsc", "settings", "suspend", "warm"}) {
		t.Errorf("top-level keys %v", got)
	}
	for path, w := range want {
		var v any
		switch path {
		case "warm[0]":
			v = obj["warm"].([]any)[0]
		case "allocation.fresh_ms":
			v = obj["allocation"].(map[string]any)["fresh_ms"]
		case "instance.warm[0]":
			v = obj["instance"].(map[string]any)["warm"].([]any)[0]
		case "memory.modes[0]":
			v = obj["memory"].(map[string]any)["modes"].([]any)[0]
		case "callback.inside_ms":
			v = obj["callback"].(map[string]any)["inside_ms"]
		case "egress.connect_ms":
			v = obj["egress"].(map[string]any)["connect_ms"]
		case "long.python":
			v = obj["long"].(map[string]any)["python"]
		default:
			v = obj[path]
		}
		if got := keys(v); !slices.Equal(got, w) {
			t.Errorf("%s: keys %v, want %v", path, got, w)
		}
	}
}

// validateJSON checks the schema of `flmbox bench --json`. The integration
// test has its own copy, against a real run.
func validateJSON(obj map[string]any, retained, crane bool) error {
	isStats := func(v any) error {
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("not an object: %v", v)
		}
		for _, k := range []string{"median", "min", "max", "n"} {
			if _, ok := m[k].(json.Number); !ok {
				return fmt.Errorf("%s: not a number: %v", k, m[k])
			}
		}
		return nil
	}
	section := func(name string) map[string]any { m, _ := obj[name].(map[string]any); return m }
	numbers := func(m map[string]any, keys ...string) error {
		for _, k := range keys {
			if _, ok := m[k].(json.Number); !ok {
				return fmt.Errorf("%s: not a number: %v", k, m[k])
			}
		}
		return nil
	}
	alloc := section("allocation")
	for _, k := range []string{"fresh_ms", "raw_runsc_ms"} {
		if err := isStats(alloc[k]); err != nil {
			return fmt.Errorf("allocation.%s: %w", k, err)
		}
	}
	if v, ok := alloc["retained_ms"]; !ok || (v == nil) == retained {
		return fmt.Errorf("allocation.retained_ms: %v (present %t)", v, ok)
	}
	warm, _ := obj["warm"].([]any)
	if len(warm) != 4 {
		return fmt.Errorf("warm: %d entries, want 4", len(warm))
	}
	seen := map[string]bool{}
	for _, w := range warm {
		m, _ := w.(map[string]any)
		api, _ := m["api"].(string)
		lang, _ := m["language"].(string)
		if (api != "sandbox" && api != "batch") || (lang != "python" && lang != "shell") {
			return fmt.Errorf("warm: api %q, language %q", api, lang)
		}
		seen[api+"/"+lang] = true
		if err := numbers(m, "median_ms", "p95_ms", "inprocess_median_ms", "runsc_exec_median_ms", "native_median_ms"); err != nil {
			return fmt.Errorf("warm %s/%s: %w", api, lang, err)
		}
	}
	if len(seen) != 4 {
		return fmt.Errorf("warm: %v, want every api and language", seen)
	}
	if err := numbers(section("batch"), "snippets", "parallel", "serial_s", "parallel_s"); err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	pw := section("prewarm")
	if err := numbers(pw, "cold_ms", "hit_ms"); err != nil {
		return fmt.Errorf("prewarm: %w", err)
	}
	if v, ok := pw["crane_tar_ms"]; !ok || (v == nil) == crane {
		return fmt.Errorf("prewarm.crane_tar_ms: %v (present %t)", v, ok)
	}
	if err := numbers(section("memory"), "sandbox_kib", "bare_runsc_kib"); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	in := section("instance")
	for _, k := range []string{"enter_first_result_ms", "socket_ms", "enter_ms", "fresh_ms"} {
		if err := isStats(in[k]); err != nil {
			return fmt.Errorf("instance.%s: %w", k, err)
		}
	}
	iw, _ := in["warm"].([]any)
	if len(iw) != 2 {
		return fmt.Errorf("instance.warm: %d entries, want 2", len(iw))
	}
	for i, lang := range []string{"python", "shell"} {
		m, _ := iw[i].(map[string]any)
		if got, _ := m["language"].(string); got != lang {
			return fmt.Errorf("instance.warm[%d]: language %q, want %q", i, got, lang)
		}
		if err := numbers(m, "median_ms", "p95_ms", "cli_median_ms", "cli_p95_ms", "calls"); err != nil {
			return fmt.Errorf("instance.warm[%d]: %w", i, err)
		}
	}
	cb := section("callback")
	for _, k := range []string{"inside_ms", "host_ms"} {
		if err := isStats(cb[k]); err != nil {
			return fmt.Errorf("callback.%s: %w", k, err)
		}
		if err := numbers(cb[k].(map[string]any), "p95"); err != nil {
			return fmt.Errorf("callback.%s: %w", k, err)
		}
	}
	if err := numbers(cb, "added_ms", "round_trips", "runs"); err != nil {
		return fmt.Errorf("callback: %w", err)
	}
	eg := section("egress")
	for _, k := range []string{"first_result_ms", "none_first_result_ms", "download_ms", "host_download_ms", "host_network_download_ms",
		"connect_ms", "host_connect_ms", "host_network_connect_ms"} {
		if err := isStats(eg[k]); err != nil {
			return fmt.Errorf("egress.%s: %w", k, err)
		}
	}
	if err := numbers(eg, "download_bytes", "download_mib_per_s", "host_download_mib_per_s", "host_network_download_mib_per_s",
		"connects", "runs"); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	rs := section("runsc")
	for _, k := range []string{"path", "version", "platform"} {
		if s, _ := rs[k].(string); s == "" {
			return fmt.Errorf("runsc.%s: %v", k, rs[k])
		}
	}
	return nil
}

func TestTable(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport(false, true).WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"FIGURE", "REFERENCE", "raw runsc 120 ms", "1.42×", "191 ms", "82 ms", "n/a",
		"warm call, sandbox API, python", "25.16 ms", "runsc exec 26.0 ms", "chroot 14.0 ms",
		"--parallel 1 40.0 s", "crane export | tar -x 1400 ms", "0.79×", "≤ 20 ms", "58.6 MiB", "systrap",
		"10 calls per round (back to back)", "(linux/amd64, 1MiB)",
		"new flmbox instance → first result", "flmbox run --image 160 ms", "1.56×", "until its socket answers",
		"warm task over gRPC, python (OnTaskInvoke)", "flmbox run --sandbox 16.0 ms", "0.88×", "flmbox run --sandbox 12.0 ms",
		"callback round trip from inside, 1 KiB each way (Go API)", "0.420 ms", "host to host 0.060 ms", "7.00×",
		"host to host 0.100 ms", "9.00×", "added per round trip", "0.360 ms", "≤ 0.5 ms added",
		"callbacks: median of 2 calls' medians (p95: of their p95s), 50 round trips each after 5 warm-up ones",
		"new egress sandbox → first result (run --image --network egress)", "--network none 200 ms", "1.15×", "≤ 1.15×",
		"100 MiB over HTTP, egress sandbox", "250 MiB/s (400 ms)", "host python3 1000 MiB/s (100 ms)", "0.25× throughput", "≥ 0.5×",
		"500 MiB/s (200 ms)", "0.50× throughput", "TCP connect + close, egress sandbox", "0.300 ms", "host python3 0.050 ms", "6.00×",
		"host python3 0.080 ms", "7.50×", "0.200 ms", "4.00×",
		"egress: in network namespaces of the bench's own", "a side: downloads 3, connects 2 runs of 50 after 5 not measured",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	sampleReport(true, false).WriteTable(&buf)
	if out := buf.String(); !strings.Contains(out, "crane export | tar -x n/a") || !strings.Contains(out, "80.0 ms") {
		t.Errorf("without crane, with retained:\n%s", out)
	}
	none := sampleReport(false, true)
	none.Instance = Instance{}
	buf.Reset()
	none.WriteTable(&buf)
	if out := buf.String(); strings.Contains(out, "flmbox instance") || strings.Contains(out, "OnTaskInvoke") {
		t.Errorf("flmbox instance not measured:\n%s", out)
	}
	none.Callback = Callback{}
	buf.Reset()
	none.WriteTable(&buf)
	if out := buf.String(); strings.Contains(out, "callback") {
		t.Errorf("callbacks not measured:\n%s", out)
	}
	none.Egress = Egress{}
	buf.Reset()
	none.WriteTable(&buf)
	if out := buf.String(); strings.Contains(out, "egress") {
		t.Errorf("egress not measured:\n%s", out)
	}
	paced := sampleReport(false, true)
	paced.Settings.PauseMS = 20
	buf.Reset()
	paced.WriteTable(&buf)
	if out := buf.String(); !strings.Contains(out, "(each after a 20 ms pause)") {
		t.Errorf("paced warm calls:\n%s", out)
	}
}
