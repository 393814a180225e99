package snippet

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The memory watch.
//
// gVisor keeps all of a sandbox's memory, its processes' and its /tmp's, in
// one host file charged to the sandbox's memory cgroup, and past the cgroup's
// limit the host kills the whole sandbox, /tmp and all. No rlimit bounds that
// sum of the snippets' memory and what /tmp holds (the agent sets no
// RLIMIT_AS: see wire.Limits). So while snippets run, the agent reads how much
// memory the sandbox uses (Agent.MemInfo, /proc/meminfo: MemTotal -
// MemAvailable, plus Agent.InodeBytes for each inode used in Agent.CleanDirs,
// see filesBytes): first memFirstRead after a call starts, which notes what
// the sandbox used then, and then the sooner the less is left (memInterval).
// When less than memReserve of Agent.MemoryBudget is left, it kills a
// snippet that has run since the
// sandbox used less (by more than memTolerance): the one whose process group
// holds the most memory if there are several, one at a time, none while a
// killed one is still going (once it is gone, the others are blamed only for
// what they use from then on). It reports it out of memory (Result.OOMKilled);
// the sandbox and its files survive. The spares go before any call
// (dropSparesForMemory), and none starts while memory is short (memoryShort):
// one that starts next to a call makes the call look as if it grew. flmbox
// sets the cgroup's limit above the budget (runtime.MemoryHeadroom), so that
// the watch, which shares the sandbox's CPU with the snippets it watches, has
// time to act. A snippet that started when memory was already short and does
// not use more is left alone, so that a call can still delete files from a
// /tmp that fills the sandbox. Calls shorter than memFirstRead, while no other
// call runs, never read the file.

// How often the watch reads the sandbox's memory. The first read comes
// memFirstRead after a call starts: it only notes what the sandbox uses, and
// most calls end before it, paying nothing for the watch. After it, the next
// read comes when the snippets could have used what is left above twice the
// reserve at memGrowthRate (memInterval): every memPollMax while the sandbox is
// far from its budget, every memPoll closer, every memPollShort once less than
// twice the reserve is left, where snippets allocating at once can take
// megabytes between two reads (docs/PERFORMANCE.md, "Memory watch"). A read
// is not free under gVisor: it wakes the agent on the sandbox's CPU quota,
// which the snippets would have had, and may make the sentry scan its memory
// file: the more often it reads, the slower a pure-Python loop runs beside
// it (docs/PERFORMANCE.md, "Long calls").
//
// While every snippet running was called by a client that nudges the agent
// as the host sees the sandbox's memory grow (wire.Request.MemoryNudges), the
// watch reads when nudged, and by the clock only for what the host does not
// see (memNudgedInterval: every 0.4 to 1 s while memory is not short),
// which costs a pure-Python loop little of its speed (docs/PERFORMANCE.md,
// "Long calls").
const (
	memFirstRead         = 20 * time.Millisecond
	memPollMax           = 100 * time.Millisecond
	memPoll              = 5 * time.Millisecond
	memPollShort         = time.Millisecond
	memPollNudgedDefault = time.Second
)

// memPollNudged is memPollNudgedDefault, and memUnseenRate
// memUnseenRateDefault: variables for tests.
var (
	memPollNudged = memPollNudgedDefault
	memUnseenRate = int64(memUnseenRateDefault)
)

// memUnseenRateDefault is how fast, in bytes a second for each CPU, the
// watch assumes that a sandbox's memory can grow where the host does not see
// it, so that no nudge comes: files' inodes (InodeBytes each), which gVisor
// keeps in its own heap, reusing what it freed (a snippet made some 18,000
// empty files, 180 MiB at InodeBytes, within a second after 24,000 were
// removed, and no nudge came: the watch, reading every second, let it make
// 42,000 in a 256 MiB sandbox, and the rm -rf that followed outgrew its
// tolerance).
const memUnseenRateDefault = 256 << 20

// memGrowthRate is how fast, in bytes a second, the watch assumes a sandbox's
// memory can grow for each CPU it is shown: twice the fastest seen here. One
// process grows by 0.5 to 1 GiB/s under systrap (a bytearray, b'x' * n or a
// write to /tmp of 200 MiB), and four processes of a one-CPU sandbox took 2
// MiB per millisecond in bursts, running on both of the host's CPUs until the
// quota of each period was spent.
const memGrowthRate = 4 << 30

// memInterval is the time until the next read, with left bytes of the budget
// left: how long the snippets would take, growing at memGrowthRate on every
// one of cpus CPUs, to leave less than twice the reserve, within memPoll and
// memPollMax; memPollShort once less than twice the reserve is left.
func memInterval(left, reserve int64, cpus int) time.Duration {
	return memIntervalAt(left, reserve, cpus, memGrowthRate, memPoll, memPollMax)
}

// memNudgedInterval is memInterval for snippets whose clients nudge: the
// time growth the host does not see (memUnseenRate) would take to leave
// less than twice the reserve, within memPollMax and memPollNudged.
func memNudgedInterval(left, reserve int64, cpus int) time.Duration {
	return memIntervalAt(left, reserve, cpus, memUnseenRate, memPollMax, memPollNudged)
}

// memIntervalAt is the time memory growing at rate bytes a second on each
// of cpus CPUs takes to leave less than twice the reserve, within lo and hi;
// memPollShort once less is left.
func memIntervalAt(left, reserve int64, cpus int, rate int64, lo, hi time.Duration) time.Duration {
	if left < 2*reserve {
		return memPollShort
	}
	d := time.Duration(float64(left-2*reserve) / float64(rate*int64(max(cpus, 1))) * float64(time.Second))
	return min(max(d, lo), hi)
}

// memReserve is the memory left of a budget below which the watch kills
// growing snippets: a sixteenth, 16 to 128 MiB, for what grows until the
// snippets are dead.
func memReserve(budget int64) int64 { return min(max(budget/16, 16<<20), 128<<20) }

// memWatch is the agent's memory watch: the snippets running, and the timer
// of the next read while there are some. A call that ends before the timer
// fires stops it: no wake-up is left behind.
type memWatch struct {
	mu    sync.Mutex
	procs map[*proc]int64 // running snippet → bytes used at the first read (-1 before)
	// registered is when each snippet of procs began to be watched, by
	// the count of registrations: a read begun before a snippet was
	// registered is not its first read.
	registered    map[*proc]int
	registrations int
	// unnudged counts the snippets of procs whose client does not nudge
	// (wire.Request.MemoryNudges); nudges counts the nudges.
	unnudged int
	nudges   int
	nudged   map[*proc]bool
	slow     bool        // the timer was set for nudged calls alone
	dying    []*proc     // killed, not yet gone: their memory is not back yet
	timer    *time.Timer // nil when no read is due
	short    bool        // the last read found less than twice the reserve left
	// checks counts the checks done, read or not, each counted once it
	// has acted: tests wait on it to know that the watch saw a change.
	checks int
	// What /proc/meminfo does not show yet (see growthSince): its last
	// reading, the resident memory of each process of the watched groups
	// when it was first measured since that reading, when those were last
	// measured, and how much they had grown then.
	lastMem int64
	rssBase map[int]int64 // pid → resident bytes at its first measure
	rssAt   time.Time
	growth  int64
	// info is Agent.MemInfo kept open, if it is a file of procfs (see
	// Agent.readMemInfo), opened once.
	openInfo sync.Once
	info     *os.File
}

// memRSSPoll is how often, while snippets run and the sandbox is not far from
// its budget (reads closer than memPollMax), the watch measures how much
// their processes grew since /proc/meminfo last changed: gVisor refreshes it
// only every so often (it rate-limits its scan of the sandbox's memory to an
// eighth of a CPU), so next to processes growing at full speed it lags by
// steps large enough to outrun the cgroup's headroom (docs/PERFORMANCE.md,
// "The smallest sandbox, by experiment"). Far from the budget the reads are
// far apart, each sees a fresh scan, and a pass over /proc (a fraction of a
// millisecond a process under gVisor) would cost more than the read.
const memRSSPoll = 20 * time.Millisecond

// growthSince returns how much the processes of the watched snippets' groups
// grew, in resident memory, since /proc/meminfo last changed (its reading is
// memUsed), measuring them again every memRSSPoll: a lower bound of what the
// reading does not show yet. Each process counts from its own first measure,
// so a forked child's pages shared with its parent (which gVisor's resident
// figure shows in both, as it shows Pss = Rss) count once, not in every child
// (docs/PERFORMANCE.md, "The smallest sandbox, by experiment").
func (a *Agent) growthSince(memUsed int64) int64 {
	w := &a.mem
	w.mu.Lock()
	if memUsed != w.lastMem {
		w.lastMem, w.rssBase, w.growth = memUsed, nil, 0
	}
	if time.Since(w.rssAt) < memRSSPoll {
		defer w.mu.Unlock()
		return w.growth
	}
	pgids := make(map[int]bool, len(w.procs))
	for p := range w.procs {
		pgids[p.pid] = true
	}
	w.mu.Unlock()
	procs := readProcRSS()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rssAt = time.Now()
	if w.lastMem != memUsed {
		return 0 // another check saw a new reading meanwhile
	}
	if w.rssBase == nil {
		w.rssBase = map[int]int64{}
	}
	var growth int64
	for _, pr := range procs {
		if !pgids[pr.pgid] {
			continue
		}
		base, ok := w.rssBase[pr.pid]
		if !ok {
			w.rssBase[pr.pid] = pr.rss
			continue
		}
		growth += max(0, pr.rss-base)
	}
	w.growth = growth
	return growth
}

// watchMemory watches p while it runs; the returned function stops, after
// which the watch no longer kills p.
func (a *Agent) watchMemory(p *proc, nudged bool) (stop func()) {
	if a.MemInfo == "" {
		return func() {}
	}
	w := &a.mem
	w.mu.Lock()
	if w.procs == nil {
		w.procs = map[*proc]int64{}
		w.nudged = map[*proc]bool{}
	}
	w.procs[p] = -1
	w.nudged[p] = nudged
	if !nudged {
		w.unnudged++
		// A read set for nudged calls alone is too late for this one.
		if w.slow && w.timer != nil && w.timer.Stop() {
			w.timer.Reset(memFirstRead)
			w.slow = false
		}
	}
	if w.registered == nil {
		w.registered = map[*proc]int{}
	}
	w.registrations++
	w.registered[p] = w.registrations
	if w.timer == nil {
		w.timer = time.AfterFunc(memFirstRead, a.checkMemory)
	}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.forget(p)
		if len(w.procs) > 0 {
			return
		}
		// No snippet runs: stop reading. A timer that already fired is
		// running checkMemory, which clears it.
		w.dying = slices.DeleteFunc(w.dying, (*proc).exited)
		if len(w.dying) == 0 && w.timer != nil && w.timer.Stop() {
			w.timer, w.slow = nil, false
		}
	}
}

// checkMemory reads the memory, kills a growing snippet if it runs out, and
// sets the next read while snippets run.
func (a *Agent) checkMemory() {
	w := &a.mem
	next, nextNudged := memPoll, memPoll
	w.mu.Lock()
	seen := w.registrations // the snippets this read is for
	nudges := w.nudges
	w.mu.Unlock()
	if total, avail, ok := a.readMemInfo(); ok {
		budget := total
		if a.MemoryBudget > 0 && a.MemoryBudget < total {
			budget = a.MemoryBudget
		}
		used, reserve := total-avail+a.filesBytes(), memReserve(budget)
		cpus := goruntime.NumCPU()
		if memInterval(budget-used, reserve, cpus) < memPollMax {
			used += a.growthSince(total - avail)
		}
		left := budget - used
		next, nextNudged = memInterval(left, reserve, cpus), memNudgedInterval(left, reserve, cpus)
		var spares []*proc
		if left < reserve {
			spares = a.dropSparesForMemory()
		}
		w.mu.Lock()
		w.short = left < 2*reserve
		dying := len(w.dying)
		w.dying = slices.DeleteFunc(w.dying, (*proc).exited)
		// Once the killed ones are gone, the others are blamed only for
		// what they use from now on. So too once the spares are killed,
		// which go first: a spare that started next to a call (after the
		// previous call's answer) made the call look as if it grew.
		rebase := dying > 0 && len(w.dying) == 0 || len(spares) > 0
		var grown []*proc
		for p, first := range w.procs {
			switch {
			case first < 0 && w.registered[p] > seen:
				// Registered after the read began: its first read is the next.
			case first < 0 || rebase:
				w.procs[p] = used
			case left < reserve && used > first+memTolerance(reserve) && !p.exited():
				grown = append(grown, p)
			}
		}
		// One at a time, the biggest first, and none while a killed one
		// still holds its memory: the others may be innocent neighbours.
		if len(grown) > 0 && len(w.dying) == 0 {
			p := grown[0]
			if len(grown) > 1 {
				rss := groupsRSS()
				p = slices.MaxFunc(grown, func(x, y *proc) int { return cmp.Compare(rss[x.pid], rss[y.pid]) })
			}
			p.oomKilled.Store(true)
			p.sigkill()
			w.forget(p)
			w.dying = append(w.dying, p)
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checks++
	w.slow = false
	if len(w.procs) == 0 && len(w.dying) == 0 {
		w.timer = nil
		return
	}
	switch {
	case w.nudges != nudges:
		next = 0 // nudged while it read: read again
	case w.unnudged == 0 && !w.short && len(w.dying) == 0:
		next, w.slow = max(next, nextNudged), true
	}
	w.timer.Reset(next)
}

// forget stops watching p.
//
// Precondition: w.mu is held.
func (w *memWatch) forget(p *proc) {
	if _, ok := w.procs[p]; !ok {
		return
	}
	if !w.nudged[p] {
		w.unnudged--
	}
	delete(w.procs, p)
	delete(w.registered, p)
	delete(w.nudged, p)
}

// nudgeMemory reads the sandbox's memory at once, if snippets are watched:
// a client saw it grow (wire.MemoryNudge). A read under way reads again
// when it is done.
func (a *Agent) nudgeMemory() {
	w := &a.mem
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nudges++
	if w.timer != nil && w.timer.Stop() {
		w.timer.Reset(0)
		w.slow = false
	}
}

// dropSparesForMemory kills the agent's spares, once memory runs short, and
// returns them. The zygote stays: it was there before the calls started.
func (a *Agent) dropSparesForMemory() []*proc {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ps []*proc
	for lang, p := range a.spares {
		delete(a.spares, lang)
		p.discard()
		ps = append(ps, p)
	}
	return ps
}

// memoryShort says whether the sandbox has less than twice the reserve
// left: then no spare is started, whose memory the next call would be
// blamed for (it would start next to it), and which the watch would kill.
// Only when the watch's last read found memory short is it read again, so
// that calls pay nothing for it otherwise.
func (a *Agent) memoryShort() bool {
	w := &a.mem
	w.mu.Lock()
	short := w.short
	w.mu.Unlock()
	if !short {
		return false
	}
	short = a.memoryLow()
	w.mu.Lock()
	w.short = short
	w.mu.Unlock()
	return short
}

// memoryLow says whether the sandbox has less than twice the reserve left,
// by a read of Agent.MemInfo (false without a watch, or if it cannot be
// read).
func (a *Agent) memoryLow() bool {
	if a.MemInfo == "" {
		return false
	}
	total, avail, ok := a.readMemInfo()
	if !ok {
		return false
	}
	budget := total
	if a.MemoryBudget > 0 && a.MemoryBudget < total {
		budget = a.MemoryBudget
	}
	return budget-(total-avail+a.filesBytes()) < 2*memReserve(budget)
}

// usedInodes is the number of inodes used on the file system of dir, or 0;
// tests replace it.
var usedInodes = usedInodesStatfs

func usedInodesStatfs(dir string) int64 {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Files < st.Ffree {
		return 0
	}
	return int64(st.Files - st.Ffree)
}

// filesBytes is what the files in CleanDirs cost gVisor beyond their data:
// their inodes (statfs) at InodeBytes each. Their metadata is gVisor's own
// memory, which /proc/meminfo does not show, charged to the sandbox's memory
// cgroup all the same: empty files alone can kill a sandbox
// (docs/ARCHITECTURE.md, "The memory watch"; docs/PERFORMANCE.md, "What a file
// costs gVisor"). A directory that is not there counts nothing.
func (a *Agent) filesBytes() int64 {
	if a.InodeBytes <= 0 {
		return 0
	}
	var n int64
	for _, dir := range a.CleanDirs {
		n += usedInodes(dir)
	}
	return n * a.InodeBytes
}

// memTolerance is the growth since a snippet's first read that does not count:
// a clean-up call may start a process or import a module, and rm -rf reads a
// whole directory before it deletes a file. Half the reserve, at least 8 MiB,
// lets rm -rf empty a /tmp that empty files filled (docs/PERFORMANCE.md,
// "Memory watch").
func memTolerance(reserve int64) int64 { return max(reserve/2, 8<<20) }

// groupsRSS returns the resident memory of each process group, by its ID,
// from one pass over /proc; files a group wrote to /tmp do not count.
func groupsRSS() map[int]int64 {
	rss := map[int]int64{}
	for _, p := range readProcRSS() {
		rss[p.pgid] += p.rss
	}
	return rss
}

// procRSS is a process's resident memory.
type procRSS struct {
	pid, pgid int
	rss       int64 // bytes
}

// readProcRSS returns the resident memory of every process, from one pass
// over /proc.
func readProcRSS() []procRSS {
	ents, _ := os.ReadDir("/proc")
	out := make([]procRSS, 0, len(ents))
	page := int64(os.Getpagesize())
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// After the command's closing parenthesis: state, ppid, pgrp, ...,
		// rss is the 22nd.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 22 {
			continue
		}
		pgid, err1 := strconv.Atoi(string(f[2]))
		pages, err2 := strconv.ParseInt(string(f[21]), 10, 64)
		if err1 == nil && err2 == nil {
			out = append(out, procRSS{pid: pid, pgid: pgid, rss: pages * page})
		}
	}
	return out
}

// readMemInfo reads MemTotal and MemAvailable from Agent.MemInfo. A file of
// procfs is opened once and read at offset 0 from then on, which makes the
// kernel (gVisor's) generate it anew: under gVisor opening a file of /proc
// costs ten times what a read of the open file does. Any other file (a
// test's) is opened for each read.
func (a *Agent) readMemInfo() (total, avail int64, ok bool) {
	w := &a.mem
	w.openInfo.Do(func() {
		f, err := os.Open(a.MemInfo)
		if err != nil {
			return
		}
		var st unix.Statfs_t
		if unix.Fstatfs(int(f.Fd()), &st) != nil || st.Type != unix.PROC_SUPER_MAGIC {
			f.Close()
			return
		}
		w.info = f
	})
	if w.info == nil {
		b, err := os.ReadFile(a.MemInfo)
		if err != nil {
			return 0, 0, false
		}
		return parseMemInfo(b)
	}
	buf := make([]byte, 8<<10)
	n, err := w.info.ReadAt(buf, 0)
	if n == 0 || err != nil && !errors.Is(err, io.EOF) {
		return 0, 0, false
	}
	return parseMemInfo(buf[:n])
}

// parseMemInfo reads MemTotal and MemAvailable, in bytes, from the text of a
// /proc/meminfo file.
func parseMemInfo(b []byte) (total, avail int64, ok bool) {
	total, avail = -1, -1
	for line := range bytes.Lines(b) {
		key, rest, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		var dst *int64
		switch string(key) {
		case "MemTotal":
			dst = &total
		case "MemAvailable":
			dst = &avail
		default:
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, 0, false
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || n < 0 {
			return 0, 0, false
		}
		*dst = n << 10
	}
	return total, avail, total > 0 && avail >= 0
}
