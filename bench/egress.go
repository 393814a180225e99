package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const (
	// downloadBytes is the size of the download figure's file.
	downloadBytes = 100 << 20
	// connectWarmup is the number of connects each run makes before its
	// measured ones, not measured.
	connectWarmup = 5
	// maxDownloads and maxConnects bound Options.EgressDownloads and
	// EgressConnects.
	maxDownloads, maxConnects = 100, 10000
	// egressLinkPrefix starts the worker's end of an egress sandbox's link
	// (egress.HostLink), which the bench checks are gone at the end.
	egressLinkPrefix = "flmb"
)

// downloadCode is the Python code of the download figure, for every side:
// it times (perf_counter) an HTTP GET of url read to the end through a
// buffer, with no proxy whatever the environment says, and prints
// "SECONDS BYTES" (parseDownload reads it).
func downloadCode(url string) string {
	return fmt.Sprintf(`import time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
buf = bytearray(1 << 20)
start = time.perf_counter()
got = 0
with opener.open(%q, timeout=60) as r:
    while True:
        n = r.readinto(buf)
        if not n:
            break
        got += n
print(time.perf_counter() - start, got)
`, url)
}

// parseDownload reads downloadCode's output: the download's time in
// milliseconds, after checking that it read want bytes.
func parseDownload(out string, want int64) (float64, error) {
	f := strings.Fields(out)
	if len(f) != 2 {
		return 0, fmt.Errorf("read the download's time: %q", lastLines(out, 3))
	}
	s, err1 := strconv.ParseFloat(f[0], 64)
	n, err2 := strconv.ParseInt(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil || s <= 0 {
		return 0, fmt.Errorf("read the download's time: %q", lastLines(out, 3))
	}
	if n != want {
		return 0, fmt.Errorf("check the download: %d bytes, want %d", n, want)
	}
	return s * 1000, nil
}

// connectCode is the Python code of the connect figure, for every side:
// warmup and then n TCP connects to host:port, each closed at once and
// timed from the connect until the close returns (perf_counter_ns). It
// prints a line of nanoseconds per connect, the warm-up ones first
// (parseConnects reads them).
func connectCode(host string, port, warmup, n int) string {
	return fmt.Sprintf(`import socket, time
out = []
for _ in range(%d):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    start = time.perf_counter_ns()
    s.connect((%q, %d))
    s.close()
    out.append(time.perf_counter_ns() - start)
print("\n".join(map(str, out)))
`, warmup+n, host, port)
}

// parseConnects reads connectCode's output, warmup+n lines, and returns the
// measured connects' times in milliseconds, without the warm-up ones.
func parseConnects(out string, warmup, n int) ([]float64, error) {
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != warmup+n {
		return nil, fmt.Errorf("read the connects' times: %d lines, want %d: %q", len(lines), warmup+n, lastLines(out, 3))
	}
	xs := make([]float64, 0, n)
	for i, l := range lines {
		ns, err := strconv.ParseInt(strings.TrimSpace(l), 10, 64)
		if err != nil || ns <= 0 {
			return nil, fmt.Errorf("read the connects' times: line %d: %q", i+1, l)
		}
		if i >= warmup {
			xs = append(xs, float64(ns)/1e6)
		}
	}
	return xs, nil
}

// netSide is one way of running the download and connect code: in an
// egress sandbox, in the host's python3, in a host-network sandbox; all in
// the worker namespace.
type netSide struct {
	name string
	run  func(ctx context.Context, code string) (string, error)
	ms   []float64   // downloads
	conn [][]float64 // connect runs
}

// measureEgress measures --network egress in two network
// namespaces of its own (see benchNet), removed at the end with the
// sandboxes it made there:
//
//   - a new egress sandbox's first result, whole `flmbox run --image
//     --network egress` processes against `--network none` ones,
//     alternating, Pairs pairs after one not measured;
//   - a download of downloadBytes from world's server, EgressDownloads
//     times, and Rounds runs of EgressConnects TCP connects to it (after
//     connectWarmup others), each side in turn: a persistent egress
//     sandbox, the host's python3 in worker, a --network host sandbox.
func (r *runner) measureEgress(ctx context.Context) (_ Egress, err error) {
	rep := Egress{DownloadBytes: downloadBytes}
	r.logf("egress: network namespaces world and worker")
	n, err := newBenchNet(fmt.Sprintf("%s-%d", strings.TrimPrefix(filepath.Base(r.dir), "bench-"), os.Getpid()))
	if err != nil {
		return rep, err
	}
	var made []string // persistent sandboxes
	defer func() {
		ctx := context.WithoutCancel(ctx)
		if len(made) > 0 {
			_, _, rmErr := timeCommand(r.flmboxAt(ctx, n.worker, append([]string{"sandbox", "rm"}, made...)...))
			err = errors.Join(err, rmErr)
			if rmErr == nil {
				err = errors.Join(err, linksLeft(n.worker))
			}
		}
		err = errors.Join(err, n.close())
	}()

	egressFlags := []string{"--network", "egress", "--allow", internetAddr, "--dns", internetAddr}
	if err := r.measureEgressFirstResult(ctx, &rep, n.worker, egressFlags); err != nil {
		return rep, err
	}
	if err := linksLeft(n.worker); err != nil {
		return rep, fmt.Errorf("after the egress sandboxes' first results: %w", err)
	}

	sandboxSide := func(name string, flags ...string) (*netSide, error) {
		args := append([]string{"sandbox", "create", "--name", name, "--image", r.ref}, flags...)
		made = append(made, name) // removed even if create fails half-way (rm of none is no error)
		if _, _, err := timeCommand(r.flmboxAt(ctx, n.worker, args...)); err != nil {
			return nil, err
		}
		return &netSide{name: name, run: func(ctx context.Context, code string) (string, error) {
			_, out, err := timeCommand(r.flmboxAt(ctx, n.worker, "run", "--sandbox", name, "-c", code))
			return string(out), err
		}}, nil
	}
	r.logf("egress: persistent egress and host-network sandboxes")
	eg, err := sandboxSide("bench-egress", egressFlags...)
	if err != nil {
		return rep, err
	}
	hostnet, err := sandboxSide("bench-hostnet", "--network", "host")
	if err != nil {
		return rep, err
	}
	host := &netSide{name: "host python3", run: func(ctx context.Context, code string) (string, error) {
		_, out, err := timeCommand(exec.CommandContext(ctx, r.nsenter, "--net="+n.worker, "--", r.python, "-c", code))
		return string(out), err
	}}
	sides := []*netSide{eg, host, hostnet}

	url := fmt.Sprintf("http://%s/bytes/%d", internetAddr, downloadBytes)
	for i := range r.opts.EgressDownloads {
		r.logf("egress: download %d of %d", i+1, r.opts.EgressDownloads)
		for j := range sides {
			s := sides[(i+j)%len(sides)]
			out, err := s.run(ctx, downloadCode(url))
			var d float64
			if err == nil {
				d, err = parseDownload(out, downloadBytes)
			}
			if err != nil {
				return rep, fmt.Errorf("egress download (%s): %w", s.name, err)
			}
			s.ms = append(s.ms, d)
		}
	}
	code := connectCode(internetAddr, 80, connectWarmup, r.opts.EgressConnects)
	for i := range r.opts.Rounds {
		r.logf("egress: connects, round %d of %d", i+1, r.opts.Rounds)
		for j := range sides {
			s := sides[(i+j)%len(sides)]
			out, err := s.run(ctx, code)
			var xs []float64
			if err == nil {
				xs, err = parseConnects(out, connectWarmup, r.opts.EgressConnects)
			}
			if err != nil {
				return rep, fmt.Errorf("egress connects (%s): %w", s.name, err)
			}
			s.conn = append(s.conn, xs)
		}
	}
	rep.DownloadMS, rep.HostDownloadMS, rep.HostNetworkDownloadMS = summarize(eg.ms), summarize(host.ms), summarize(hostnet.ms)
	mibs := func(s Stats) float64 { return float64(downloadBytes) / (1 << 20) / (s.Median / 1000) }
	rep.DownloadMiBps, rep.HostDownloadMiBps, rep.HostNetworkDownloadMiBps = mibs(rep.DownloadMS), mibs(rep.HostDownloadMS), mibs(rep.HostNetworkDownloadMS)
	rep.ConnectMS, rep.HostConnectMS, rep.HostNetworkConnectMS = summarizeRounds(eg.conn), summarizeRounds(host.conn), summarizeRounds(hostnet.conn)
	rep.Connects, rep.Runs = r.opts.Rounds*r.opts.EgressConnects, r.opts.Rounds
	return rep, nil
}

// measureEgressFirstResult times whole `flmbox run --image` processes in
// worker with egressFlags and with --network none, in alternating order,
// Pairs pairs after one that is not measured.
func (r *runner) measureEgressFirstResult(ctx context.Context, rep *Egress, worker string, egressFlags []string) error {
	kinds := []struct {
		name  string
		flags []string
		ms    []float64
	}{{name: "--network egress", flags: egressFlags}, {name: "--network none", flags: []string{"--network", "none"}}}
	for i := -1; i < r.opts.Pairs; i++ {
		if i >= 0 {
			r.logf("egress: first result, pair %d of %d", i+1, r.opts.Pairs)
		}
		for j := range kinds {
			k := &kinds[(max(i, 0)+j)%len(kinds)]
			args := append(append([]string{"run", "--image", r.ref}, k.flags...), "-c", pythonSnippet.code)
			d, err := timeToOutput(r.flmboxAt(ctx, worker, args...), wantOutput)
			if err != nil {
				return fmt.Errorf("egress first result (%s): %w", k.name, err)
			}
			if i >= 0 {
				k.ms = append(k.ms, ms(d))
			}
		}
	}
	rep.FirstResultMS, rep.NoneFirstResultMS = summarize(kinds[0].ms), summarize(kinds[1].ms)
	return nil
}

// flmboxAt returns r.flmbox's command run in the network namespace bound at
// netNS, by nsenter, which enters that namespace only: the mounts under
// the state root stay the host's. nsenter execs flmbox, which gets the
// SIGTERM of a cancelled ctx.
func (r *runner) flmboxAt(ctx context.Context, netNS string, args ...string) *exec.Cmd {
	cmd := r.flmbox(ctx, args...)
	cmd.Path = r.nsenter
	cmd.Args = append([]string{r.nsenter, "--net=" + netNS, "--"}, append([]string{r.flmboxBin}, cmd.Args[1:]...)...)
	return cmd
}

// linksLeft fails if the namespace bound at netNS has a link of an egress
// sandbox: one that flmbox should have removed with its sandbox.
func linksLeft(netNS string) error {
	ns, err := netns.GetFromPath(netNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return err
	}
	var left []string
	for _, l := range links {
		if name := l.Attrs().Name; strings.HasPrefix(name, egressLinkPrefix) {
			left = append(left, name)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("egress sandboxes' links left after their removal: %s", strings.Join(left, ", "))
	}
	return nil
}
