package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/docker/go-units"
)

// The reference system's figures: its own cluster, gVisor, one
// CPU per worker.
const (
	refFresh    = "191 ms (168–207)"
	refRetained = "82 ms (70–92)"
)

// refWarm is the reference system's warm call medians, by API and language;
// flmbox's batch API is compared with its session API (one worker).
var refWarm = map[[2]string]string{
	{"sandbox", "python"}: "25.16 ms", {"sandbox", "shell"}: "8.60 ms",
	{"batch", "python"}: "23.64 ms (session)", {"batch", "shell"}: "8.67 ms (session)",
}

// WriteTable writes the report as the table `flmbox bench` prints: each
// figure beside its baseline, their ratio, the target and the reference
// system's figure, then how it was measured, the image and runsc.
func (rep *Report) WriteTable(w io.Writer) error {
	if rep.Settings.LongOnly {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FIGURE\tFLMBOX\tBASELINE\tRATIO\tTARGET")
		for _, r := range longRows(rep.Long) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.figure, r.flmbox, r.baseline, r.ratio, r.target)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "\nmedians of %d runs of each, in rotating order\n", rep.Long.Python.FlmboxMS.N)
		return rep.writeFooter(w)
	}
	if rep.Settings.DensityOnly && rep.Density != nil {
		if err := rep.Density.writeTable(w); err != nil {
			return err
		}
		return rep.writeFooter(w)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tFLMBOX\tBASELINE\tRATIO\tTARGET\tREFERENCE")
	for _, r := range tableRows(rep) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.figure, r.flmbox, r.baseline, r.ratio, r.target, r.reference)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	pace := "back to back"
	if rep.Settings.PauseMS > 0 {
		pace = fmt.Sprintf("each after a %g ms pause", rep.Settings.PauseMS)
	}
	fmt.Fprintf(w, "\nmedians; warm calls: median of %d rounds' medians (p95: of their p95s), %d calls per round (%s) after %d warm-up calls\n",
		rep.Settings.Rounds, rep.Settings.Calls, pace, rep.Settings.Warmup)
	if cb := rep.Callback; cb.Runs > 0 {
		fmt.Fprintf(w, "callbacks: median of %d calls' medians (p95: of their p95s), %d round trips each after %d warm-up ones, alternating with as many host python3 processes\n",
			cb.Runs, cb.RoundTrips/cb.Runs, callbackWarmup)
	}
	if e := rep.Egress; e.Runs > 0 {
		fmt.Fprintf(w, "egress: in network namespaces of the bench's own, from a server of its own, timed by the Python code, host python3 in the same namespace; a side: downloads %d, connects %d runs of %d after %d not measured\n",
			e.DownloadMS.N, e.Runs, e.Connects/e.Runs, connectWarmup)
	}
	if rep.Density != nil {
		fmt.Fprintln(w)
		if err := rep.Density.writeTable(w); err != nil {
			return err
		}
	}
	return rep.writeFooter(w)
}

// writeFooter writes the image and runsc lines.
func (rep *Report) writeFooter(w io.Writer) error {
	fmt.Fprintf(w, "image:  %s (%s, %s)\n", rep.Image.Ref, rep.Image.Platform, units.BytesSize(float64(rep.Image.SizeBytes)))
	_, err := fmt.Fprintf(w, "runsc:  %s (%s, platform %s); %d CPUs\n", rep.Runsc.Path, rep.Runsc.Version, rep.Runsc.Platform, rep.Settings.CPUs)
	return err
}

// row is one line of the table.
type row struct{ figure, flmbox, baseline, ratio, target, reference string }

// tableRows are the table's lines, in order.
func tableRows(rep *Report) []row {
	a := rep.Allocation
	raw := "raw runsc " + fmtMS(a.RawRunscMS.Median)
	rows := []row{
		{"new sandbox → first result (flmbox run --image)", fmtMS(a.FreshMS.Median), raw, ratio(a.FreshMS.Median, a.RawRunscMS.Median), "≤ 0.95×", refFresh},
		{"  in process (Go API)", fmtMS(a.FreshInprocessMS.Median), raw, ratio(a.FreshInprocessMS.Median, a.RawRunscMS.Median), "", ""},
		{"retained sandbox → first result", "n/a", "", "", "", refRetained},
	}
	if a.RetainedMS != nil {
		rows[2].flmbox, rows[2].baseline, rows[2].ratio, rows[2].target = fmtMS(a.RetainedMS.Median), raw, ratio(a.RetainedMS.Median, a.RawRunscMS.Median), "≤ 0.25×"
	}
	if a.PooledMS != nil && a.PooledReleaseMS != nil {
		rows = append(rows,
			row{"warm pool → first result (flmbox run --image)", fmtMS(a.PooledMS.Median), raw, ratio(a.PooledMS.Median, a.RawRunscMS.Median), "≤ 0.08×", ""},
			row{"  then its reset back into the pool, until exit", fmtMS(a.PooledReleaseMS.Median), "", "", "", ""})
	}
	for _, w := range rep.Warm {
		exec := "runsc exec " + fmtMS(w.RunscExecMedianMS)
		target := "≤ 0.5×"
		if w.API == "batch" && w.Language == "shell" {
			target = "≤ 0.6×" // a batch of one pays for its batch's bookkeeping
		}
		rows = append(rows,
			row{fmt.Sprintf("warm call, %s API, %s (flmbox run)", w.API, w.Language), fmtMS(w.MedianMS), exec,
				ratio(w.MedianMS, w.RunscExecMedianMS), target, refWarm[[2]string{w.API, w.Language}]},
			row{"  p95", fmtMS(w.P95MS), "runsc exec " + fmtMS(w.RunscExecP95MS), ratio(w.P95MS, w.RunscExecP95MS), "", ""},
			row{"  in process (Go API)", fmtMS(w.InprocessMedianMS), exec, ratio(w.InprocessMedianMS, w.RunscExecMedianMS), "≤ 0.5×", ""},
			row{"  against no sandbox", fmtMS(w.MedianMS), "chroot " + fmtMS(w.NativeMedianMS), ratio(w.MedianMS, w.NativeMedianMS), "", ""},
		)
	}
	rows = append(rows, longRows(rep.Long)...)
	rows = append(rows, instanceRows(rep.Instance)...)
	rows = append(rows, callbackRows(rep.Callback)...)
	if rc := rep.Records; rc.GetMS.N > 0 {
		minmax := func(s Stats) string { return fmt.Sprintf("min %s, max %s", fmtMS(s.Min), fmtMS(s.Max)) }
		rows = append(rows,
			row{"Manager.Get of a sandbox (in process)", fmtMS(rc.GetMS.Median), minmax(rc.GetMS), "", "≤ 2 ms", ""},
			row{fmt.Sprintf("  Manager.List of %d sandboxes", rc.Sandboxes), fmtMS(rc.ListMS.Median), minmax(rc.ListMS), "", "≤ 5 ms", ""},
			row{fmt.Sprintf("  Manager.Probe of %d sandboxes", rc.Sandboxes), fmtMS(rc.ProbeMS.Median), minmax(rc.ProbeMS), "", "", ""})
	}
	bt, p, m := rep.Batch, rep.Prewarm, rep.Memory
	rows = append(rows,
		row{fmt.Sprintf("batch of %d CPU-bound snippets (%.2f s each), --parallel %d", bt.Snippets, bt.SnippetNativeS, bt.Parallel),
			fmt.Sprintf("%.1f s", bt.ParallelS), fmt.Sprintf("--parallel 1 %.1f s", bt.SerialS), ratio(bt.ParallelS, bt.SerialS), "", ""},
		row{"cold prewarm from a loopback registry", fmtMS(p.ColdMS), "crane export | tar -x n/a", "", "≤ 0.8×", ""},
		row{"cache-hit prewarm by index digest", fmtMS(p.HitMS), "", "", "≤ 20 ms", ""},
		row{"host memory of an idle sandbox (PSS)", fmtKiB(m.SandboxKiB), "bare runsc sleep " + fmtKiB(m.BareRunscKiB), ratio(float64(m.SandboxKiB), float64(m.BareRunscKiB)), "≤ 1.2×", ""},
		row{"  RSS", fmtKiB(m.SandboxRSSKiB), "bare runsc sleep " + fmtKiB(m.BareRunscRSSKiB), ratio(float64(m.SandboxRSSKiB), float64(m.BareRunscRSSKiB)), "", ""},
	)
	for _, md := range m.Modes {
		target := "≤ 1.2×"
		if md.Spares == "lazy" {
			target = "≤ 1.0×"
		}
		rows = append(rows,
			row{fmt.Sprintf("  %s spares: idle, new (PSS)", md.Spares), fmtKiB(md.KiB), "bare runsc sleep " + fmtKiB(m.BareRunscKiB), ratio(float64(md.KiB), float64(m.BareRunscKiB)), target, ""},
			row{fmt.Sprintf("  %s spares: idle after calls (PSS)", md.Spares), fmtKiB(md.UsedKiB), "bare runsc sleep " + fmtKiB(m.BareRunscKiB), ratio(float64(md.UsedKiB), float64(m.BareRunscKiB)), "", ""},
			row{fmt.Sprintf("  %s spares: first Python call, then shell", md.Spares), fmtMS(md.FirstPythonMS), fmtMS(md.FirstShellMS), "", "", ""},
			row{fmt.Sprintf("  %s spares: warm Python, shell (Go API)", md.Spares), fmtMS(md.WarmPythonMS.Median), fmtMS(md.WarmShellMS.Median), "", "", ""},
		)
	}
	if p.CraneTarMS != nil {
		r := &rows[len(rows)-4-4*len(m.Modes)]
		r.baseline, r.ratio = "crane export | tar -x "+fmtMS(*p.CraneTarMS), ratio(p.ColdMS, *p.CraneTarMS)
	}
	if b := p.Big; b != nil {
		name := fmt.Sprintf("cold prewarm of a %s image the bench builds (%d layers)", fmtBytes(b.Bytes), b.Layers)
		r := row{name, fmtMS(b.Cold.Median), "crane export | tar -x n/a", "", "≤ 0.8×", ""}
		if b.CraneTar != nil {
			r.baseline, r.ratio = "crane export | tar -x "+fmtMS(b.CraneTar.Median), ratio(b.Cold.Median, b.CraneTar.Median)
		}
		rows = append(rows, r,
			row{"  the most the disk's used bytes grew meanwhile", fmtBytes(b.PeakDiskBytes), "unpacked " + fmtBytes(b.Bytes),
				ratio(float64(b.PeakDiskBytes), float64(b.Bytes)), "≤ 1.1×", ""})
	}
	if cp := rep.Copy; cp.InMS.N > 0 {
		mib := float64(cp.Bytes) / (1 << 20)
		tput := func(ms float64) string { return fmt.Sprintf("%.0f MiB/s", mib/(ms/1000)) }
		rows = append(rows,
			row{fmt.Sprintf("flmbox cp of %.0f MiB into a sandbox", mib), fmtMS(cp.InMS.Median) + " (" + tput(cp.InMS.Median) + ")",
				"tar | tar on the host " + fmtMS(cp.HostTarMS.Median), ratio(cp.HostTarMS.Median, cp.InMS.Median) + " throughput", "≥ 0.5×", ""},
			row{"  out of a sandbox", fmtMS(cp.OutMS.Median) + " (" + tput(cp.OutMS.Median) + ")",
				"tar | tar on the host " + fmtMS(cp.HostTarMS.Median), ratio(cp.HostTarMS.Median, cp.OutMS.Median) + " throughput", "≥ 0.5×", ""})
	}
	if su := rep.Suspend; su.SuspendMS.N > 0 {
		// measureSuspend times run --image in the same rounds as the resumes.
		fresh, freshMS := "flmbox run --image "+fmtMS(su.FreshFirstResultMS.Median)+" (same rounds)", su.FreshFirstResultMS.Median
		rows = append(rows,
			row{fmt.Sprintf("sandbox suspend, %d MiB in /tmp (image %s)", su.TmpBytes>>20, units.BytesSize(float64(su.ImageBytes))), fmtMS(su.SuspendMS.Median),
				"runsc checkpoint " + fmtMS(su.RawCheckpointMS.Median), ratio(su.SuspendMS.Median, su.RawCheckpointMS.Median), "", ""},
			row{"  resume → first result (flmbox run --sandbox)", fmtMS(su.ResumeFirstResultMS.Median), fresh,
				ratio(su.ResumeFirstResultMS.Median, freshMS), "≤ 1.0×", ""},
			row{"  against runsc restore + exec", fmtMS(su.ResumeFirstResultMS.Median), "runsc restore + exec " + fmtMS(su.RawRestoreFirstResultMS.Median),
				ratio(su.ResumeFirstResultMS.Median, su.RawRestoreFirstResultMS.Median), "", ""},
			row{"  host processes left while suspended", fmt.Sprint(su.SuspendedProcesses), "", "", "0", ""})
	}
	rows = append(rows, egressRows(rep.Egress)...)
	if pm := rep.Pool; pm.IdleKiB > 0 && pm.BareKiB > 0 {
		bare := "bare runsc sleep " + fmtKiB(pm.BareKiB)
		rows = append(rows,
			row{"host memory of an idle pooled sandbox, used once (PSS, side by side)", fmtKiB(pm.IdleKiB), bare,
				ratio(float64(pm.IdleKiB), float64(pm.BareKiB)), "≤ 1.25×", ""},
			row{"  with lazy spares (pool fill --lazy-spares)", fmtKiB(pm.LazyIdleKiB), bare,
				ratio(float64(pm.LazyIdleKiB), float64(pm.BareKiB)), "≤ 1.25×", ""})
	}
	return rows
}

// longRows are the table's lines of long calls, none if they were not
// measured.
func longRows(l Long) []row {
	var rows []row
	for _, w := range []*LongWork{&l.Python, l.Numpy} {
		if w == nil || w.FlmboxMS.N == 0 {
			continue
		}
		rows = append(rows,
			row{fmt.Sprintf("long call: %s (its own time)", w.Work), fmtMS(w.FlmboxMS.Median), "runsc exec " + fmtMS(w.RunscExecMS.Median),
				ratio(w.FlmboxMS.Median, w.RunscExecMS.Median), "≤ 1.05×", ""},
			row{fmt.Sprintf("  against bare runsc (%d CPUs shown; flmbox %d)", w.BareCPUs, w.CPUs), fmtMS(w.FlmboxMS.Median),
				"bare runsc exec " + fmtMS(w.BareRunscMS.Median), ratio(w.FlmboxMS.Median, w.BareRunscMS.Median), "≤ 1.05×", ""})
	}
	if l.NumpyMissing != "" {
		rows = append(rows, row{"long call: numpy SVD", "n/a", l.NumpyMissing, "", "", ""})
	}
	return rows
}

// instanceRows are the table's lines of flmbox instance, none if it was not
// measured.
func instanceRows(in Instance) []row {
	var rows []row
	if in.EnterFirstResultMS.N > 0 {
		fresh := "flmbox run --image " + fmtMS(in.FreshMS.Median)
		rows = append(rows,
			row{"new flmbox instance → first result (Flame's calls)", fmtMS(in.EnterFirstResultMS.Median), fresh,
				ratio(in.EnterFirstResultMS.Median, in.FreshMS.Median), "≤ 1.0×", ""},
			row{"  until its socket answers", fmtMS(in.SocketMS.Median), "", "", "", ""},
			row{"  OnSessionEnter (the session's sandbox)", fmtMS(in.EnterMS.Median), "", "", "", ""},
		)
	}
	for _, w := range in.Warm {
		rows = append(rows,
			row{fmt.Sprintf("warm task over gRPC, %s (OnTaskInvoke)", w.Language), fmtMS(w.MedianMS),
				"flmbox run --sandbox " + fmtMS(w.CLIMedianMS), ratio(w.MedianMS, w.CLIMedianMS), "", ""},
			row{"  p95", fmtMS(w.P95MS), "flmbox run --sandbox " + fmtMS(w.CLIP95MS), ratio(w.P95MS, w.CLIP95MS), "", ""},
		)
	}
	return rows
}

// callbackRows are the table's lines of the callback round trip, none if
// it was not measured.
func callbackRows(cb Callback) []row {
	if cb.Runs == 0 {
		return nil
	}
	in, host := cb.InsideMS, cb.HostMS
	return []row{
		{"callback round trip from inside, 1 KiB each way (Go API)", fmtFineMS(in.Median), "host to host " + fmtFineMS(host.Median),
			ratio(in.Median, host.Median), "", ""},
		{"  p95", fmtFineMS(in.P95), "host to host " + fmtFineMS(host.P95), ratio(in.P95, host.P95), "", ""},
		{"  added per round trip", fmtFineMS(cb.AddedMS), "", "", "≤ 0.5 ms added", ""},
	}
}

// egressRows are the table's lines of --network egress, none if it was not
// measured.
func egressRows(e Egress) []row {
	if e.FirstResultMS.N == 0 {
		return nil
	}
	mib := float64(e.DownloadBytes) / (1 << 20)
	tput := func(s Stats, mibps float64) string { return fmt.Sprintf("%.0f MiB/s (%s)", mibps, fmtMS(s.Median)) }
	host := "host python3 " + tput(e.HostDownloadMS, e.HostDownloadMiBps)
	hostConn := "host python3 " + fmtFineMS(e.HostConnectMS.Median)
	return []row{
		{"new egress sandbox → first result (run --image --network egress)", fmtMS(e.FirstResultMS.Median),
			"--network none " + fmtMS(e.NoneFirstResultMS.Median), ratio(e.FirstResultMS.Median, e.NoneFirstResultMS.Median), "≤ 1.15×", ""},
		{fmt.Sprintf("%.0f MiB over HTTP, egress sandbox", mib), tput(e.DownloadMS, e.DownloadMiBps), host,
			ratio(e.DownloadMiBps, e.HostDownloadMiBps) + " throughput", "≥ 0.5×", ""},
		{"  --network host sandbox", tput(e.HostNetworkDownloadMS, e.HostNetworkDownloadMiBps), host,
			ratio(e.HostNetworkDownloadMiBps, e.HostDownloadMiBps) + " throughput", "", ""},
		{"TCP connect + close, egress sandbox", fmtFineMS(e.ConnectMS.Median), hostConn, ratio(e.ConnectMS.Median, e.HostConnectMS.Median), "", ""},
		{"  p95", fmtFineMS(e.ConnectMS.P95), "host python3 " + fmtFineMS(e.HostConnectMS.P95), ratio(e.ConnectMS.P95, e.HostConnectMS.P95), "", ""},
		{"  --network host sandbox", fmtFineMS(e.HostNetworkConnectMS.Median), hostConn,
			ratio(e.HostNetworkConnectMS.Median, e.HostConnectMS.Median), "", ""},
	}
}

func fmtMS(x float64) string {
	if x >= 100 {
		return fmt.Sprintf("%.0f ms", x)
	}
	return fmt.Sprintf("%.1f ms", x)
}

// fmtFineMS is fmtMS with microseconds below 10 ms.
func fmtFineMS(x float64) string {
	if x < 10 && x > -10 {
		return fmt.Sprintf("%.3f ms", x)
	}
	return fmtMS(x)
}

func fmtKiB(k int64) string { return fmt.Sprintf("%.1f MiB", float64(k)/1024) }

func ratio(x, base float64) string {
	if base <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2f×", x/base)
}

// writeDensity writes the density section: a table per series, a line per
// count, and the ratio of the last count's figures to the first's (one
// sandbox).
func (d *Density) writeTable(w io.Writer) error {
	l := d.Limits
	fmt.Fprintf(w, "density: idle sandboxes made one after another (Manager.Create), measured at 1 and every tenth of %d; %d suspended\n", d.Sandboxes, d.Suspended)
	fmt.Fprintf(w, "host limits: at most %d running sandboxes (set by %s), %d suspended (free disk %s)\n",
		l.MaxSandboxes, l.CappedBy, l.MaxSuspended, fmtGiB(l.DiskFreeBytes))
	for _, s := range d.Series {
		if len(s.Points) == 0 {
			continue
		}
		fmt.Fprintln(w)
		if s.Name == "suspended" {
			fmt.Fprintf(w, "suspended (default spares, each suspended right after its create): resumed, called and removed at the end: %d of %d answered; remove %s\n",
				s.Checked-s.NotAnswering, s.Checked, fmtStats(s.RemoveMS))
		} else {
			fmt.Fprintf(w, "%s spares: called at the end: %d of %d answered; remove %s\n",
				s.Name, s.Checked-s.NotAnswering, s.Checked, fmtStats(s.RemoveMS))
		}
		if s.FirstFailure != "" {
			fmt.Fprintf(w, "  first failure: %s\n", s.FirstFailure)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, line := range densityLines(s) {
			fmt.Fprintln(tw, strings.Join(line, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w, "\nms: median (min–max) of the creates since the count before, of "+
		fmt.Sprintf("%d calls and %d run --sandbox on %d random sandboxes (each after its first call, FIRST), %d Manager.List and %d sandbox ls --json; ",
			densityCalls, densityCLICalls, densityCallees, densityLists, densityCLILists)+
		fmt.Sprintf("CPU: %% of all CPUs over %s idle (HOST: all of it); MEM: MemAvailable's drop; PSS: the sandboxes' processes; CGROUP: charged to their cgroups.\n", densityCPUWindow)+
		"targets at 500: all answering; create and warm call ≤ 1.2× one sandbox; host CPU ≤ 5 %; memory ≤ 20 MiB a sandbox, ≤ 12 MiB lazy; 2,000 suspended")
	return err
}

// densityCol is a column of a series' table: its header, its cell of a
// point, and the figure whose last-to-first ratio ends the column (nil:
// none).
type densityCol struct {
	head  string
	cell  func(p DensityPoint) string
	value func(p DensityPoint) float64
}

// statCol is a column of Stats (ms), nil in some points.
func statCol(head string, get func(p *DensityPoint) *Stats) densityCol {
	return densityCol{head, func(p DensityPoint) string {
		if s := get(&p); s != nil {
			return fmtStats(*s)
		}
		return ""
	}, func(p DensityPoint) float64 {
		if s := get(&p); s != nil {
			return s.Median
		}
		return 0
	}}
}

// kibCol is a column of KiB, shown in MiB.
func kibCol(head string, get func(p DensityPoint) int64) densityCol {
	return densityCol{head, func(p DensityPoint) string { return fmtKiB(get(p)) }, func(p DensityPoint) float64 { return float64(get(p)) }}
}

// numCol is a column of counts per sandbox.
func numCol(head string, get func(p DensityPoint) float64) densityCol {
	return densityCol{head, func(p DensityPoint) string { return fmt.Sprintf("%.1f", get(p)) }, get}
}

// pctCol is a column of %, with no ratio.
func pctCol(head string, get func(p DensityPoint) float64) densityCol {
	return densityCol{head, func(p DensityPoint) string { return fmt.Sprintf("%.1f %%", get(p)) }, nil}
}

// densityLines are the lines of a series' table: its header, a line per
// point, then the ratios of the last point's figures to the first's.
func densityLines(s DensitySeries) [][]string {
	first, last := s.Points[0], s.Points[len(s.Points)-1]
	list := []densityCol{
		statCol("LIST ms", func(p *DensityPoint) *Stats { return &p.ListMS }),
		statCol("SANDBOX LS ms", func(p *DensityPoint) *Stats { return &p.CLIListMS }),
		pctCol("HOST CPU", func(p DensityPoint) float64 { return p.HostCPUPercent }),
		pctCol("SANDBOXES' CPU", func(p DensityPoint) float64 { return p.SandboxCPUPercent }),
	}
	var cols []densityCol
	if s.Name == "suspended" {
		cols = append(cols,
			kibCol("DISK/SB", func(p DensityPoint) int64 { return p.DiskPerSandboxBytes >> 10 }),
			kibCol("IMAGE", func(p DensityPoint) int64 { return p.ImageBytes >> 10 }),
			statCol("CREATE ms", func(p *DensityPoint) *Stats { return &p.CreateMS }),
			statCol("SUSPEND ms", func(p *DensityPoint) *Stats { return p.SuspendMS }),
			statCol("RESUME+CALL ms", func(p *DensityPoint) *Stats { return p.ResumeMS }),
			statCol("RUN --SANDBOX ms", func(p *DensityPoint) *Stats { return p.CLIResumeMS }))
		cols = append(cols, list...)
		cols = append(cols,
			kibCol("MEM/SB", func(p DensityPoint) int64 { return p.MemPerSandboxKiB }),
			numCol("PROCESSES/SB", func(p DensityPoint) float64 { return p.ProcessesPerSandbox }))
	} else {
		cols = append(cols,
			kibCol("MEM/SB", func(p DensityPoint) int64 { return p.MemPerSandboxKiB }),
			kibCol("PSS/SB", func(p DensityPoint) int64 { return p.PSSPerSandboxKiB }),
			kibCol("CGROUP/SB", func(p DensityPoint) int64 { return p.CgroupPerSandboxKiB }),
			statCol("CREATE ms", func(p *DensityPoint) *Stats { return &p.CreateMS }),
			statCol("FIRST CALL ms", func(p *DensityPoint) *Stats { return p.FirstCallMS }),
			statCol("WARM CALL ms", func(p *DensityPoint) *Stats { return p.CallMS }),
			statCol("RUN --SANDBOX ms", func(p *DensityPoint) *Stats { return p.CLICallMS }))
		cols = append(cols, list...)
		cols = append(cols,
			numCol("TASKS/SB", func(p DensityPoint) float64 { return p.TasksPerSandbox }),
			numCol("FDS/SB", func(p DensityPoint) float64 { return p.FDsPerSandbox }))
	}
	head := []string{"SANDBOXES"}
	for _, c := range cols {
		head = append(head, c.head)
	}
	lines := [][]string{head}
	for _, p := range s.Points {
		line := []string{fmt.Sprint(p.Sandboxes)}
		for _, c := range cols {
			line = append(line, c.cell(p))
		}
		lines = append(lines, line)
	}
	ratios := []string{fmt.Sprintf("%d vs 1", last.Sandboxes)}
	for _, c := range cols {
		r := ""
		if c.value != nil && c.value(last) >= 0 {
			r = ratio(c.value(last), c.value(first))
		}
		ratios = append(ratios, r)
	}
	return append(lines, ratios)
}

// fmtStats is "median (min–max)" in ms, without the unit.
func fmtStats(s Stats) string {
	if s.N == 0 {
		return "n/a"
	}
	num := func(x float64) string {
		if x >= 100 {
			return fmt.Sprintf("%.0f", x)
		}
		return fmt.Sprintf("%.1f", x)
	}
	if s.N == 1 {
		return num(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", num(s.Median), num(s.Min), num(s.Max))
}
