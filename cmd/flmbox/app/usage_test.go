package app

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
)

// TestUsageErrors: a command line that does not parse, or asks for what
// cannot be had, is refused in one line that names the flag, exit 125,
// before anything runs: no "Incorrect Usage", no help.
func TestUsageErrors(t *testing.T) {
	cpus := goruntime.NumCPU()
	sock := filepath.Join(t.TempDir(), "instance.sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Durations: invalid, negative, zero, a number without its unit.
		{[]string{"run", "--timeout", "-1", "-c", "1"}, "--timeout -1: want a positive duration such as 30s"},
		{[]string{"run", "--timeout", "-1s", "-c", "1"}, "--timeout -1s: want a positive duration such as 30s"},
		{[]string{"run", "--sandbox", "s", "-c", "1", "--timeout", "0"}, "--timeout 0: want a positive duration such as 30s"},
		{[]string{"run", "--timeout", "10", "-c", "1"}, "--timeout 10: want a positive duration such as 30s"},
		{[]string{"run", "--callback-idle", "soon", "-c", "1"}, "--callback-idle soon: want a positive duration such as 30s"},
		{[]string{"instance", "--timeout", "-5s"}, "--timeout -5s: want a positive duration such as 30s"},
		{[]string{"pool", "fill", "--size", "1", "--idle-timeout", "0", "img"}, "--idle-timeout 0: want a positive duration such as 30s"},
		{[]string{"pipcache", "fetch", "--image", "img", "--timeout", "x", "numpy"}, "--timeout x: want a positive duration such as 30s"},
		{[]string{"sandbox", "gc", "--remove-idle", "-5m"}, "--remove-idle -5m: want a positive duration such as 30s"},
		{[]string{"images", "gc", "--unused-for", "-1h"}, "--unused-for -1h: want 0 or a duration such as 30s"},
		// Numbers and booleans.
		{[]string{"sandbox", "create", "--image", "img", "--pids", "1.5"}, "--pids 1.5: want a whole number"},
		{[]string{"run", "--image", "img", "--cpus", "x", "-c", "1"}, "--cpus x: want a number such as 2 or 0.5"},
		{[]string{"run", "--json=maybe", "-c", "1"}, "--json maybe: want true or false"},
		// Unknown flags, at each level.
		{[]string{"run", "-x", "-c", "1"}, "flag provided but not defined: -x; flmbox run --help lists the flags"},
		{[]string{"sandbox", "create", "--bogus", "1"}, "flag provided but not defined: --bogus; flmbox sandbox create --help lists the flags"},
		{[]string{"--bogus", "run"}, "flag provided but not defined: --bogus; flmbox --help lists the flags"},
		// Commands that do not exist, at each level; no "help" command, nor
		// its alias "h", at any.
		{[]string{"frob"}, `no command "frob"; flmbox --help lists them`},
		{[]string{"sandbox", "frob"}, `sandbox has no command "frob"; flmbox sandbox --help lists them`},
		{[]string{"help"}, `no command "help"; flmbox --help lists them`},
		{[]string{"pool", "h"}, `pool has no command "h"; flmbox pool --help lists them`},
		// A flag without its value.
		{[]string{"run", "-c", "1", "--timeout"}, "--timeout needs a value: a positive duration such as 30s"},
		{[]string{"pool", "fill", "img", "--memory"}, "--memory needs a value; flmbox pool fill --help lists the flags"},
		// Flags that must be given.
		{[]string{"sandbox", "create"}, "sandbox create needs --image; flmbox sandbox create --help lists the flags"},
		{[]string{"pool", "fill", "img"}, "pool fill needs --size; flmbox pool fill --help lists the flags"},
		// Limits no sandbox on this host can have.
		{[]string{"run", "--image", "img", "--cpus", "1000", "-c", "1"}, fmt.Sprintf("sandbox limits: cpus 1000 is more than this host's %d: invalid argument", cpus)},
		{[]string{"sandbox", "create", "--image", "img", "--cpus", "0"}, "--cpus 0: want more than 0"},
		{[]string{"sandbox", "create", "--image", "img", "--pids", "-1"}, "--pids -1: want more than 0"},
		{[]string{"run", "--image", "img", "--tmp-size", "100TiB", "-c", "1"}, "sandbox limits: /tmp size 109951162777600 bytes is more than the memory limit of 536870912 (/tmp is a tmpfs: its files are memory): invalid argument"},
		{[]string{"pool", "fill", "--size", "1", "--memory", "1GiB", "--tmp-size", "2GiB", "img"}, "sandbox limits: /tmp size 2147483648 bytes is more than the memory limit of 1073741824 (/tmp is a tmpfs: its files are memory): invalid argument"},
		{[]string{"instance", "--listen", sock, "--cpus", "1000"}, fmt.Sprintf("sandbox limits: cpus 1000 is more than this host's %d: invalid argument", cpus)},
		{[]string{"instance", "--listen", sock, "--tmp-size", "1GiB"}, "sandbox limits: /tmp size 1073741824 bytes is more than the memory limit of 536870912 (/tmp is a tmpfs: its files are memory): invalid argument"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"flmbox", "--root", t.TempDir()}, tc.args...)
		code := Run(t.Context(), args, &stdout, &stderr)
		if code != 125 || stderr.String() != "flmbox: "+tc.want+"\n" || stdout.Len() != 0 {
			t.Errorf("flmbox %s: exit %d\nstdout %q\nstderr %q\nwant   %q", strings.Join(tc.args, " "), code, stdout.String(), stderr.String(), "flmbox: "+tc.want+"\n")
		}
	}
}

// TestEveryCommandSaysUsageErrors: every command and subcommand says its
// parse errors in one line, and every duration flag is a durationValue
// (a cli.DurationFlag would take a negative duration and, unparsed, say
// nothing of what it wants).
func TestEveryCommandSaysUsageErrors(t *testing.T) {
	app := newApp(nil, &bytes.Buffer{}, &bytes.Buffer{})
	if app.OnUsageError == nil {
		t.Error("the app has no OnUsageError")
	}
	var walk func(prefix string, cmds []*cli.Command)
	walk = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			name := prefix + c.Name
			if c.OnUsageError == nil {
				t.Errorf("%s: no OnUsageError", name)
			}
			// cli's help command would take an argument "h" or "help"
			// (sandbox rm h printed help).
			if !c.HideHelpCommand {
				t.Errorf("%s: cli adds its help command", name)
			}
			for _, f := range c.Flags {
				if _, ok := f.(*cli.DurationFlag); ok {
					t.Errorf("%s --%s: a cli.DurationFlag, not durationFlag", name, f.Names()[0])
				}
				if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() {
					t.Errorf("%s --%s: Required prints the whole help; use required()", name, f.Names()[0])
				}
			}
			walk(name+" ", c.Subcommands)
		}
	}
	walk("", app.Commands)
}

// TestSignalledCommandExitStatus: a command that fails because a signal cut
// it short exits with the signal's status, as a shell reports it (143 for
// SIGTERM), its error still said; one that fails otherwise exits 125.
func TestSignalledCommandExitStatus(t *testing.T) {
	root := t.TempDir()
	args := []string{"flmbox", "--root", root, "sandbox", "rm", "--", "no-such"}
	var stdout, stderr bytes.Buffer
	if code := runApp(context.Background(), args, nil, &stdout, &stderr); code != 0 && code != exitFlmboxFailed {
		t.Fatalf("not signalled: exit %d, want 0 or %d; stderr %q", code, exitFlmboxFailed, stderr.String())
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(&runcmd.Interrupt{Signal: syscall.SIGTERM})
	stderr.Reset()
	code := runApp(ctx, []string{"flmbox", "--root", root, "sandbox", "create", "--name", "x", "--image", "y"}, nil, &stdout, &stderr)
	if code != 143 || stderr.Len() == 0 {
		t.Fatalf("signalled: exit %d, want 143; stderr %q", code, stderr.String())
	}
}

// TestChildExitStatusIsNotFlmboxs: an error that carries a program's exit
// status (runsc's *exec.ExitError, an ExitCoder) exits 125, not with it.
func TestChildExitStatusIsNotFlmboxs(t *testing.T) {
	err := exec.Command("sh", "-c", "exit 128").Run()
	if code := exitCode(context.Background(), fmt.Errorf("restore container x with runsc: %w", err)); code != exitFlmboxFailed {
		t.Fatalf("exit %d, want %d", code, exitFlmboxFailed)
	}
	if code := exitCode(context.Background(), cli.Exit("", 124)); code != 124 {
		t.Fatalf("cli.Exit(124): exit %d", code)
	}
}

// TestArgumentsNamedLikeHelp: a sandbox may be named h or help: sandbox rm
// takes them as names (cli's help command printed the help, exit 0, and
// removed nothing).
func TestArgumentsNamedLikeHelp(t *testing.T) {
	for _, name := range []string{"h", "help"} {
		var stdout, stderr bytes.Buffer
		code := Run(t.Context(), []string{"flmbox", "--root", t.TempDir(), "sandbox", "rm", name}, &stdout, &stderr)
		if code != 0 || stdout.Len() != 0 || stderr.Len() != 0 {
			t.Errorf("flmbox sandbox rm %s: exit %d\nstdout %q\nstderr %q", name, code, stdout.String(), stderr.String())
		}
	}
}
