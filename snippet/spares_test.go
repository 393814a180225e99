package snippet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flmbox/flmbox/snippet/wire"
)

// warmUp starts a's zygote, so that its Python calls are forked by it, and
// kills it when the test ends.
func warmUp(t testing.TB, a *Agent) {
	t.Helper()
	a.init()
	a.mu.Lock()
	a.pythonUsed = true
	a.mu.Unlock()
	if a.zygote(true) == nil {
		t.Fatal("the zygote did not start")
	}
	t.Cleanup(func() { a.Close() })
}

// waitSpare waits until a has a spare of lang.
func waitSpare(t *testing.T, a *Agent, lang string) {
	t.Helper()
	waitUntil(t, "a "+lang+" spare", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.spares[lang] != nil
	})
}

// TestSpares runs the tests of Run again with spares, Python processes
// forked by the zygote and shell code read from stdin: testAgent knows them
// by their name (withSpares).
func TestSpares(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"Prints", TestRunPrints},
		{"ExitCodes", TestRunExitCodes},
		{"PythonTraceback", TestRunPythonTraceback},
		{"PythonLikeDashC", TestRunPythonLikeDashC},
		{"ShellDetails", TestRunShellDetails},
		{"StdinAtEOF", TestRunStdinAtEOF},
		{"Stdin", TestRunStdin},
		{"CallEnv", TestRunCallEnv},
		{"Interpreter", TestRunInterpreter},
		{"File", TestRunFile},
		{"Callback", TestCallback},
		{"CallbackLimits", TestCallbackLimits},
		{"CallbackOnlyTheCall", TestCallbackOnlyTheCall},
		{"CallbackServerFirst", TestCallbackServerFirst},
		{"Timeout", TestRunTimeout},
		{"KillsLeftovers", TestRunKillsLeftovers},
		{"OutputCaps", TestRunOutputCaps},
		{"NonUTF8", TestRunNonUTF8},
		{"LargeCode", TestRunLargeCode},
		{"LimitsApplied", TestRunLimitsApplied},
		{"FileSizeLimit", TestRunFileSizeLimit},
		{"Cancelled", TestRunCancelled},
		{"Concurrent", TestRunConcurrent},
	} {
		t.Run(tc.name, tc.f)
	}
}

// pidOf runs a snippet that prints its pid and its parent's.
func pidOf(t *testing.T, a *Agent, lang string) (pid, ppid int) {
	t.Helper()
	code := map[string]string{
		wire.LanguagePython: "import os; print(os.getpid(), os.getppid(), os.getpgrp())",
		wire.LanguageShell:  "echo $$ $PPID $(ps -o pgid= $$)",
	}[lang]
	res := run(t, a, request(lang, code))
	f := strings.Fields(string(res.Stdout.Data))
	if res.ExitCode != 0 || len(f) != 3 {
		t.Fatalf("want pid, ppid and pgid, got %s", dump(res))
	}
	pid, _ = strconv.Atoi(f[0])
	ppid, _ = strconv.Atoi(f[1])
	if f[2] != f[0] {
		t.Fatalf("the snippet is not the leader of its process group: %s", dump(res))
	}
	return pid, ppid
}

// TestSparesNewProcessEachCall checks that every call, spare or not, runs
// in a process of its own, and that Python processes come from the zygote
// once it runs.
func TestSparesNewProcessEachCall(t *testing.T) {
	t.Parallel()
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: true}
	defer a.Close()
	seen := map[int]bool{}
	parents := map[int]bool{}
	for i := 0; i < 6; i++ {
		for _, lang := range []string{wire.LanguagePython, wire.LanguageShell} {
			pid, ppid := pidOf(t, a, lang)
			if seen[pid] {
				t.Fatalf("call %d (%s) ran in process %d again", i, lang, pid)
			}
			seen[pid] = true
			if lang == wire.LanguagePython {
				parents[ppid] = true
			}
		}
	}
	z := a.zygote(false)
	if z == nil {
		t.Fatal("no zygote after six Python calls")
	}
	if !parents[os.Getpid()] || len(parents) != 2 {
		t.Fatalf("want Python processes started by the agent (%d) and by one zygote, got parents %v", os.Getpid(), parents)
	}
}

// TestSparesState checks that nothing of one call reaches the next through
// a spare: variables, imports, the working directory, environment changes.
func TestSparesState(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	a.Spares = true
	warmUp(t, a)
	run(t, a, request(wire.LanguagePython, "import os, json\nos.environ['LEAK'] = '1'\nos.chdir('/')\nLEAKED = 1"))
	waitSpare(t, a, wire.LanguagePython) // the next call takes it
	res := run(t, a, request(wire.LanguagePython, "import os, sys\nprint('LEAKED' in globals(), 'json' in sys.modules, os.environ.get('LEAK'), os.getcwd())"))
	if want := fmt.Sprintf("False False None %s\n", a.Dir); string(res.Stdout.Data) != want {
		t.Fatalf("want %q, got %s", want, dump(res))
	}
	// A module written by one call imports in the next one, even though its
	// process was forked before the module existed.
	run(t, a, request(wire.LanguagePython, "import os\nos.makedirs('pkgdir', exist_ok=True)\nopen('fresh_mod.py', 'w').write('V = 7\\n')"))
	res = run(t, a, request(wire.LanguagePython, "import fresh_mod; print(fresh_mod.V)"))
	if string(res.Stdout.Data) != "7\n" {
		t.Fatalf("a module of the previous call does not import: %s", dump(res))
	}
}

// TestSparesOtherLimits checks that a request whose limits differ from the
// spare's gets its own process with its own limits.
func TestSparesOtherLimits(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	a.Spares = true
	warmUp(t, a)
	for i, procs := range []int64{300, 400, 400} {
		if i > 0 {
			// A spare with the last call's limits, refused by the second
			// call and taken by the third.
			waitSpare(t, a, wire.LanguagePython)
		}
		res := run(t, a, request(wire.LanguagePython, "import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])",
			func(r *wire.Request) { r.Limits.Procs = procs }))
		if want := fmt.Sprintf("%d\n", procs); string(res.Stdout.Data) != want {
			t.Fatalf("want RLIMIT_NPROC %q, got %s", want, dump(res))
		}
	}
}

// TestZygoteDies checks that a zygote killed between calls is replaced, and
// that a call whose process the zygote was running fails clearly.
func TestZygoteDies(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	a.Spares = true
	warmUp(t, a)
	zygotePID := func() int {
		res := run(t, a, request(wire.LanguagePython, "import os; print(os.getppid())"))
		pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout.Data)))
		if err != nil || pid == os.Getpid() {
			t.Fatalf("not forked by a zygote: %s", dump(res))
		}
		return pid
	}
	zp := zygotePID()
	if err := (&os.Process{Pid: zp}).Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the spare dies with its zygote; calls still run
		res := run(t, a, request(wire.LanguagePython, "print('ok')"))
		if string(res.Stdout.Data) != "ok\n" && !strings.Contains(res.Error, "zygote") {
			t.Fatalf("after the zygote died: %s", dump(res))
		}
	}
	// A call running when its zygote dies fails and says why.
	done := make(chan *wire.Result, 1)
	go func() {
		done <- a.Run(context.Background(), request(wire.LanguagePython,
			"import os, time\nopen('running.tmp', 'w').write(str(os.getppid()))\nos.rename('running.tmp', 'running')\ntime.sleep(30)"))
	}()
	var running []byte
	waitUntil(t, "the call to start", func() bool {
		var err error
		running, err = os.ReadFile(filepath.Join(a.Dir, "running"))
		return err == nil
	})
	parent, err := strconv.Atoi(string(running))
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	z := a.zyg
	a.mu.Unlock()
	if z == nil || z.process.Pid != parent {
		t.Fatalf("the call does not run in a child of the new zygote (its parent is %d)", parent)
	}
	z.conn.Close() // the zygote exits when its socket closes
	select {
	case res := <-done:
		if res.ExitCode != -1 || !strings.Contains(res.Error, "zygote") {
			t.Fatalf("want a failure naming the zygote, got %s", dump(res))
		}
	case <-time.After(guard):
		t.Fatal("the call hangs after its zygote died")
	}
	if res := run(t, a, request(wire.LanguagePython, "print('still')")); string(res.Stdout.Data) != "still\n" {
		t.Fatalf("after the zygote died: %s", dump(res))
	}
}

// TestZygoteExit checks that a zygote's child, which leaves with os._exit,
// still does at exit what a program can see of python3's exit.
func TestZygoteExit(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	a.Spares = true
	warmUp(t, a)
	checkExit(t, a, 0)
	// It was a zygote's child.
	res := run(t, a, request(wire.LanguagePython, "import os; print(os.getppid())"))
	if strings.TrimSpace(string(res.Stdout.Data)) == strconv.Itoa(os.Getpid()) {
		t.Fatalf("not forked by the zygote: %s", dump(res))
	}
}

// TestSparesSeeNewPathDirectories checks that a directory of sys.path made
// after a spare started (pip's /tmp/site-packages) imports in the next call.
func TestSparesSeeNewPathDirectories(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	site := filepath.Join(dir, "site-packages")
	a := &Agent{Python: hostPython(t), Dir: dir, Spares: true, Env: append(os.Environ(), "PYTHONPATH="+site)}
	warmUp(t, a)
	for i := range 3 {
		run(t, a, request(wire.LanguagePython, "print('warm')"))
		waitSpare(t, a, wire.LanguagePython) // forked before the directory exists
		mod := fmt.Sprintf("m%d", i)
		run(t, a, request(wire.LanguageShell, fmt.Sprintf("mkdir -p %s && echo 'V = %d' > %s/%s.py", site, i, site, mod)))
		res := run(t, a, request(wire.LanguagePython, fmt.Sprintf("import %s; print(%s.V)", mod, mod)))
		if want := fmt.Sprintf("%d\n", i); string(res.Stdout.Data) != want {
			t.Fatalf("a module installed after the spare started does not import: %s", dump(res))
		}
		os.RemoveAll(site)
	}
}

// TestZygoteIgnoresSnippetModules checks that modules left in the working
// directory do not run in the zygote when it starts.
func TestZygoteIgnoresSnippetModules(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, m := range []string{"resource", "select", "gc"} {
		if err := os.WriteFile(filepath.Join(dir, m+".py"), []byte("import time\ntime.sleep(60)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a := &Agent{Python: hostPython(t), Dir: dir, Spares: true}
	warmUp(t, a)
	// A zygote stuck in their import would be killed, and the calls run
	// by python3 instead: they must come from the zygote.
	want := fmt.Sprintf("hi %d\n", a.zygote(false).process.Pid)
	for range 3 {
		res := run(t, a, request(wire.LanguagePython, "import os; print('hi', os.getppid())"))
		if string(res.Stdout.Data) != want {
			t.Fatalf("with shadowing modules in the working directory: %s, want stdout %q", dump(res), want)
		}
	}
}

// cancelWhenFile returns a context that is cancelled once file name exists
// in dir, and stops watching when the test ends.
func cancelWhenFile(t *testing.T, dir, name string) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				cancel(errors.New("the test gave up"))
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		cancel(nil)
	})
	return ctx
}

// TestRunLeavesItsGroup checks that a snippet that joins another process
// group is still killed when its call ends early. A timeout kills as a
// cancellation does (proc.kill); the cancellation comes once the snippet
// has left its group, where a timeout could come before.
func TestRunLeavesItsGroup(t *testing.T) {
	t.Parallel()
	for _, spares := range []bool{false, true} {
		a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: spares}
		if spares {
			warmUp(t, a)
		}
		ctx := cancelWhenFile(t, a.Dir, "left")
		res := runCtx(t, ctx, a, request(wire.LanguagePython, "import os, time\nos.setpgid(0, os.getpgid(os.getppid()))\nprint(os.getpid(), flush=True)\nopen('left', 'w').close()\ntime.sleep(1000)"))
		if res.ExitCode != -1 || !strings.Contains(res.Error, "snippet cancelled and killed") {
			t.Fatalf("spares %v: %s", spares, dump(res))
		}
		for _, pid := range pids(t, res) {
			waitGone(t, pid)
		}
	}
}

// TestZygoteStopped checks that a snippet that stops its zygote cannot
// wedge the agent: its call, cancelled once the zygote is stopped (a
// timeout kills as a cancellation does), returns (run fails if it hangs),
// and the next calls run.
func TestZygoteStopped(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	a.Spares = true
	warmUp(t, a)
	ctx := cancelWhenFile(t, a.Dir, "stopped")
	res := runCtx(t, ctx, a, request(wire.LanguagePython, "import os, signal, time\n"+
		"assert '_flmbox_zygote' in open('/proc/%d/cmdline' % os.getppid()).read(), 'not forked by the zygote'\n"+
		"os.kill(os.getppid(), signal.SIGSTOP)\nopen('stopped', 'w').close()\ntime.sleep(30)"))
	if res.ExitCode != -1 || !strings.Contains(res.Error, "snippet cancelled and killed") {
		t.Fatalf("%s", dump(res))
	}
	for range 2 {
		if res := run(t, a, request(wire.LanguagePython, "print('next')")); string(res.Stdout.Data) != "next\n" {
			t.Fatalf("after the zygote was stopped: %s", dump(res))
		}
	}
}

// TestStartupCodeOfSnippetsNeverRuns: files that snippets can write and that
// python3 runs at startup (a sitecustomize and a usercustomize on
// PYTHONPATH, a .pth file in the user site under HOME) run neither in a new
// python3 spare before it has read its gate (before its limits are set),
// nor in a zygote, which has none, even one started again after a snippet
// killed the last; the snippet's own process then does what python3 does
// with the user site (its .pth file, usercustomize), and sys.path is
// python3's.
func TestStartupCodeOfSnippetsNeverRuns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sitePackages := filepath.Join(dir, "site-packages")
	marker := filepath.Join(dir, "ran")
	py := hostPython(t)
	out, err := exec.Command(py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").Output()
	if err != nil {
		t.Fatal(err)
	}
	userSite := filepath.Join(dir, ".local", "lib", "python"+strings.TrimSpace(string(out)), "site-packages")
	for _, d := range []string{sitePackages, userSite, marker} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// KIND-early-PID when descriptor 3 is a pipe or a socket: the gate of a
	// process that has not read it yet, or the zygote's socket; late
	// otherwise (a .pth file is open at 3 while its lines run).
	payload := "import os, stat\n" +
		"try:\n    m = os.fstat(3).st_mode\nexcept OSError:\n    m = 0\n" +
		"open(os.path.join(%q, '%s-%%s-%%d' %% ('early' if stat.S_ISFIFO(m) or stat.S_ISSOCK(m) else 'late', os.getpid())), 'w')\n"
	for file, kind := range map[string]string{
		filepath.Join(sitePackages, "sitecustomize.py"): "sitecustomize",
		filepath.Join(sitePackages, "usercustomize.py"): "usercustomize",
		filepath.Join(userSite, "x.pth"):                "pth",
	} {
		code := fmt.Sprintf(payload, marker, kind)
		if kind == "pth" {
			code = "import os, stat; exec(" + strconv.Quote(code) + ")\n" // a .pth runs lines that start with import
		}
		if err := os.WriteFile(file, []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "PYTHONPATH=" + sitePackages, "LANG=C.UTF-8"}
	ran := func() (kinds []string) {
		t.Helper()
		ents, err := os.ReadDir(marker)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			kind, rest, _ := strings.Cut(e.Name(), "-")
			when, _, _ := strings.Cut(rest, "-")
			kinds = append(kinds, kind+"-"+when)
			if err := os.Remove(filepath.Join(marker, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(kinds)
		return kinds
	}

	// python3 runs all three, and sys.path is this.
	cmd := exec.Command(py, "-c", "import sys; print(sys.path)")
	cmd.Env, cmd.Dir = env, dir
	want, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	if kinds := ran(); !slices.Equal(kinds, []string{"pth-late", "sitecustomize-late", "usercustomize-late"}) {
		t.Fatalf("python3 ran %q, want the three files' code", kinds)
	}

	a := &Agent{Python: py, Dir: dir, Env: env, Spares: true}
	t.Cleanup(func() { a.Close() })
	// The snippet's own process runs what python3 runs for the user site
	// (not the sitecustomize: only the one of the site directories runs).
	late := []string{"pth-late", "usercustomize-late"}
	printPath := request(wire.LanguagePython, "import sys; print(sys.path)")
	for i := 0; i < 3; i++ { // a python3, then the zygote's children
		if res := run(t, a, printPath); res.ExitCode != 0 || string(res.Stdout.Data) != string(want) {
			t.Fatalf("call %d: sys.path %s, want %s", i, dump(res), want)
		}
		if kinds := ran(); !slices.Equal(kinds, late) {
			t.Fatalf("call %d ran %q, want %q", i, kinds, late)
		}
	}
	// A snippet kills its zygote; the next call starts another.
	kill := "import os\nif '_flmbox_zygote' in open('/proc/%d/cmdline' % os.getppid()).read():\n    print('killing', flush=True)\n    os.kill(os.getppid(), 9)"
	if res := run(t, a, request(wire.LanguagePython, kill)); string(res.Stdout.Data) != "killing\n" {
		t.Fatalf("the snippet did not come from a zygote: %s", dump(res))
	}
	ran()
	for i := 0; i < 2; i++ {
		if res := run(t, a, printPath); res.ExitCode != 0 || string(res.Stdout.Data) != string(want) {
			t.Fatalf("after the zygote died, call %d: %s, want %s", i, dump(res), want)
		}
		if kinds := ran(); !slices.Equal(kinds, late) {
			t.Fatalf("after the zygote died, call %d ran %q, want %q", i, kinds, late)
		}
	}
	// What a snippet starts is an ordinary python3.
	res := run(t, a, request(wire.LanguagePython, "import subprocess, sys\n"+
		"subprocess.run([sys.executable, '-c', 'import sys; print(sys.flags.no_site, sys.flags.no_user_site)'], check=True)"))
	if string(res.Stdout.Data) != "0 0\n" {
		t.Fatalf("a python3 that the snippet starts: %s", dump(res))
	}
	if kinds := ran(); !slices.Equal(kinds, []string{"pth-late", "pth-late", "sitecustomize-late", "usercustomize-late", "usercustomize-late"}) {
		t.Fatalf("a snippet's python3 ran %q", kinds)
	}
}

// TestZygoteReportsAChildItWasGiven: a snippet can make itself a child of
// the zygote (clone(CLONE_PARENT)); the zygote reports its exit like any
// other child's, and that must not be taken for a broken zygote (which
// failed the call running at the time).
func TestZygoteReportsAChildItWasGiven(t *testing.T) {
	t.Parallel()
	running := &proc{done: make(chan struct{})}
	z := &zygote{forks: map[int]*zygoteFork{}, procs: map[int]*proc{42: running}}
	if err := z.handle([]string{"X", "46", "9"}); err != nil {
		t.Fatalf("the exit of a child it was given: %v", err)
	}
	select {
	case <-running.done:
		t.Fatal("another child's exit ended the running one")
	default:
	}
	for _, bad := range [][]string{{"X", "46", "nine"}, {"X", "x", "9"}, {"P", "7", "46"}, {"Q", "1", "2"}} {
		if err := z.handle(bad); err == nil {
			t.Errorf("%q was taken", bad)
		}
	}
}

// TestLazySpares checks that with LazySpares the agent starts no process
// before the first call of each language, runs that call in a process of
// its own, and keeps spares (and the zygote) from then on, as without it.
// Not parallel: the agent runs in the test, and its reset kills every child
// process of the test's.
func TestLazySpares(t *testing.T) {
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: true, LazySpares: true}
	socket := serve(t, a)
	idle := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.spares) == 0 && len(a.refilling) == 0 && a.zyg == nil
	}
	// A ping is answered once Serve accepts, after it would have started
	// the first spare.
	if res := call(t, socket, &wire.Request{Version: wire.ProtocolVersion, Ping: true}); res.Error != "" {
		t.Fatalf("ping: %s", dump(res))
	}
	time.Sleep(100 * time.Millisecond)
	if !idle() {
		t.Fatal("a lazy agent started a process before any call")
	}
	// A shell call starts the shell's spare only.
	res := call(t, socket, request(wire.LanguageShell, "echo $PPID"))
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout.Data)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("the first shell call: %s", dump(res))
	}
	if a.shellIsDash {
		waitSpare(t, a, wire.LanguageShell)
	}
	a.mu.Lock()
	py := a.spares[wire.LanguagePython] != nil || a.refilling[wire.LanguagePython] != nil || a.zyg != nil
	a.mu.Unlock()
	if py {
		t.Fatal("a shell call started a Python process")
	}
	// The first Python call runs in a python3 the agent starts for it; the
	// next ones in spares forked by the zygote.
	pids := map[string]bool{}
	for i := range 3 {
		res := call(t, socket, request(wire.LanguagePython, "import os; print(os.getpid(), os.getppid())"))
		f := strings.Fields(string(res.Stdout.Data))
		if res.ExitCode != 0 || len(f) != 2 || pids[f[0]] {
			t.Fatalf("Python call %d: %s", i, dump(res))
		}
		pids[f[0]] = true
		if parent := f[1] == strconv.Itoa(os.Getpid()); parent != (i == 0) {
			t.Errorf("Python call %d ran in a child of %s; want the agent's own python3 first, then the zygote's", i, f[1])
		}
		waitSpare(t, a, wire.LanguagePython)
	}
	if a.zygote(false) == nil {
		t.Fatal("no zygote after three Python calls")
	}
	// A reset drops them all, and the next calls start them again.
	if res := call(t, socket, request(wire.LanguageShell, "true", func(r *wire.Request) { r.Reset = true })); res.ExitCode != 0 {
		t.Fatalf("reset: %s", dump(res))
	}
	res = call(t, socket, request(wire.LanguagePython, "print(1)"))
	if res.ExitCode != 0 {
		t.Fatalf("a Python call after the reset: %s", dump(res))
	}
	waitSpare(t, a, wire.LanguagePython)
}

// TestStartSpares: StartSpares returns with the Python spare started, which
// Serve's first Python call then takes (a python3, child of the agent); with
// LazySpares it starts nothing.
func TestStartSpares(t *testing.T) {
	t.Parallel()
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: true}
	a.StartSpares()
	a.mu.Lock()
	p := a.spares[wire.LanguagePython]
	a.mu.Unlock()
	if p == nil || p.exited() {
		t.Fatal("no Python spare once StartSpares returned")
	}
	socket := serve(t, a)
	res := call(t, socket, request(wire.LanguagePython, "import os; print(os.getpid(), os.getppid())"))
	if want := fmt.Sprintf("%d %d", p.pid, os.Getpid()); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout.Data)) != want {
		t.Fatalf("the first Python call: %s; want it in the spare (%s)", dump(res), want)
	}

	lazy := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: true, LazySpares: true}
	lazy.StartSpares()
	t.Cleanup(func() { lazy.Close() })
	lazy.mu.Lock()
	defer lazy.mu.Unlock()
	if len(lazy.spares) != 0 || len(lazy.refilling) != 0 {
		t.Fatal("StartSpares started a spare with LazySpares")
	}
}

// checkExit runs Python code that leaves with sys.exit(4) while a thread
// sleeps, an atexit handler and a __del__ wait, and files are open and
// unflushed in a global and a module: the call must print "main done"
// (with its parent's pid, which must be ppid, unless ppid is 0), then the
// thread's, atexit's and __del__'s lines, and exit 4, the files flushed.
func checkExit(t *testing.T, a *Agent, ppid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(a.Dir, "holder.py"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mainLine, mainPrint := "main done\n", "print('main done')"
	if ppid != 0 {
		mainLine, mainPrint = fmt.Sprintf("main done %d\n", ppid), "print('main done', os.getppid())"
	}
	code := `import atexit, os, sys, threading, time, holder
class Noisy:
    def __del__(self):
        print('del ran')
noisy = Noisy()
g = open('global.txt', 'w')
g.write('global')
holder.f = open('module.txt', 'w')
holder.f.write('module')
atexit.register(lambda: print('atexit ran'))
printed = threading.Event()
def late():
    printed.wait()
    time.sleep(0.2)
    print('thread ran')
threading.Thread(target=late).start()
` + mainPrint + `
printed.set()
sys.exit(4)
`
	res := run(t, a, request(wire.LanguagePython, code))
	if want := mainLine + "thread ran\natexit ran\ndel ran\n"; string(res.Stdout.Data) != want || res.ExitCode != 4 {
		t.Fatalf("want stdout %q and exit 4, got %s", want, dump(res))
	}
	for file, want := range map[string]string{"global.txt": "global", "module.txt": "module"} {
		if b, err := os.ReadFile(filepath.Join(a.Dir, file)); err != nil || string(b) != want {
			t.Errorf("%s holds %q (%v), want %q", file, b, err, want)
		}
	}
}

// TestPython3Exit: a python3 of the agent's own (no zygote: a new sandbox's
// first call, or calls without spares) also leaves with the bootstrap's fast
// exit, and does at exit what a program can see of python3's exit.
func TestPython3Exit(t *testing.T) {
	t.Parallel()
	for _, spares := range []bool{false, true} {
		a := testAgent(t)
		a.Spares = spares
		t.Cleanup(func() { a.Close() })
		if spares {
			a.StartSpares()
		}
		checkExit(t, a, os.Getpid()) // a child of the agent
	}
}

// TestSpareIdle checks that shrinkSpares drops the zygote and the Python
// spares that calls started and keeps what Serve starts, a python3 spare,
// and the shell's spare (nothing with LazySpares), and that the next calls
// start them again; and that it runs once no call came for SpareIdle.
func TestSpareIdle(t *testing.T) {
	t.Parallel()
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lazy=%v", lazy), func(t *testing.T) {
			a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: true, LazySpares: lazy, SpareIdle: -1}
			socket := serve(t, a)
			for i := range 3 {
				if res := call(t, socket, request(wire.LanguagePython, "print(1)")); res.ExitCode != 0 {
					t.Fatalf("Python call %d: %s", i, dump(res))
				}
				waitSpare(t, a, wire.LanguagePython)
			}
			if res := call(t, socket, request(wire.LanguageShell, "true")); res.ExitCode != 0 {
				t.Fatalf("shell call: %s", dump(res))
			}
			if a.shellIsDash {
				waitSpare(t, a, wire.LanguageShell)
			}
			z := a.zygote(false)
			if z == nil {
				t.Fatal("no zygote after three Python calls")
			}
			if a.shrinkSpares(); a.shrinks.Load() != 1 {
				t.Fatal("shrinkSpares did nothing while no call ran")
			}
			waitNewAgentSpares(t, a)
			a.mu.Lock()
			shell := a.spares[wire.LanguageShell] != nil
			a.mu.Unlock()
			if shell != (a.shellIsDash && !lazy) {
				t.Errorf("a shell spare after shrinkSpares: %v, want %v (dash %v)", shell, a.shellIsDash && !lazy, a.shellIsDash)
			}
			waitUntil(t, "the dropped zygote's exit", func() bool { return !alive(z.process.Pid) })
			// The next Python call runs in a python3 of the agent's (the
			// spare, or its own with LazySpares); a zygote forks the next.
			for i := range 2 {
				res := call(t, socket, request(wire.LanguagePython, "import os; print(os.getppid())"))
				if res.ExitCode != 0 {
					t.Fatalf("Python call %d after the spares were dropped: %s", i, dump(res))
				}
				if fromAgent := strings.TrimSpace(string(res.Stdout.Data)) == strconv.Itoa(os.Getpid()); fromAgent != (i == 0) {
					t.Errorf("Python call %d after the spares were dropped ran in a child of %s; want a python3 of the agent's first, then the zygote's", i, res.Stdout.Data)
				}
				waitSpare(t, a, wire.LanguagePython)
			}
		})
	}
	// The timer: shrinkSpares runs once no call came for SpareIdle.
	a := &Agent{Python: hostPython(t), Dir: t.TempDir(), Spares: true, SpareIdle: 200 * time.Millisecond}
	socket := serve(t, a)
	if res := call(t, socket, request(wire.LanguagePython, "print(1)")); res.ExitCode != 0 {
		t.Fatalf("Python call: %s", dump(res))
	}
	waitUntil(t, "a shrink", func() bool { return a.shrinks.Load() > 0 })
	waitNewAgentSpares(t, a)
}

// waitNewAgentSpares waits until a holds what Serve starts: a python3 spare
// of its own (and perhaps the shell's spare), or nothing with LazySpares.
func waitNewAgentSpares(t *testing.T, a *Agent) {
	t.Helper()
	waitUntil(t, "the spares of a new agent", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.zyg != nil || len(a.refilling) != 0 || a.LazySpares && a.spares[wire.LanguageShell] != nil || a.reserve != nil {
			return false
		}
		p := a.spares[wire.LanguagePython]
		if a.LazySpares {
			return p == nil
		}
		return p != nil && p.pristine && !p.exited()
	})
}

// TestSnippetMakesItsPath: a directory of sys.path that is missing when the
// snippet's code comes (PYTHONPATH's /tmp/site-packages in a new sandbox)
// imports once the code makes it, in a python3 and in a zygote's child.
func TestSnippetMakesItsPath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := &Agent{Python: hostPython(t), Dir: dir, Spares: true,
		Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "PYTHONPATH=" + filepath.Join(dir, "sp")}}
	t.Cleanup(func() { a.Close() })
	for i := 0; i < 3; i++ {
		code := fmt.Sprintf("import os\nos.makedirs('sp/mod%d')\nopen('sp/mod%d/__init__.py', 'w').write('X = %d')\nimport mod%d\nprint(mod%d.X)", i, i, i, i, i)
		if res := run(t, a, request(wire.LanguagePython, code)); res.ExitCode != 0 || string(res.Stdout.Data) != fmt.Sprintf("%d\n", i) {
			t.Fatalf("call %d: %s", i, dump(res))
		}
		os.RemoveAll(filepath.Join(dir, "sp"))
	}
}
