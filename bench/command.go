package bench

import (
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// timeCommand runs cmd and returns its wall time and stdout. A failure
// (including a non-zero exit) is an error that quotes its stderr.
func timeCommand(cmd *exec.Cmd) (time.Duration, []byte, error) {
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return d, nil, commandFailed(commandLine(cmd), err, stderr.String())
	}
	return d, []byte(stdout.String()), nil
}

// checkedCommand times cmd, a measured call, and checks that it printed
// exactly wantOutput.
func checkedCommand(cmd *exec.Cmd) (time.Duration, error) {
	d, out, err := timeCommand(cmd)
	if err != nil {
		return d, err
	}
	return d, checkOutput(commandLine(cmd), string(out), wantOutput)
}

// timeToOutput runs cmd and returns the time until wantOut has appeared on
// its stdout, which must then be exactly wantOut when cmd exits
// successfully.
func timeToOutput(cmd *exec.Cmd, wantOut string) (time.Duration, error) {
	d, _, err := timeOutputExit(cmd, wantOut)
	return d, err
}

// timeOutputExit is timeToOutput that also returns how long the process
// took until it exited.
func timeOutputExit(cmd *exec.Cmd, wantOut string) (toOutput, toExit time.Duration, err error) {
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	var got []byte
	var d time.Duration
	chunk := make([]byte, 4096)
	for d == 0 {
		n, rerr := out.Read(chunk)
		got = append(got, chunk[:n]...)
		if strings.Contains(string(got), wantOut) {
			d = time.Since(start)
		}
		if rerr != nil {
			break
		}
	}
	rest, _ := io.ReadAll(out)
	got = append(got, rest...)
	if err := cmd.Wait(); err != nil {
		return 0, 0, commandFailed(commandLine(cmd), err, stderr.String())
	}
	return d, time.Since(start), checkOutput(commandLine(cmd), string(got), wantOut)
}

// commandFailed describes a command that failed, with the end of its
// stderr. An *exec.ExitError is described, not wrapped: its ExitCode method
// would make a front that takes exit codes from errors (urfave/cli's
// ExitCoder) exit with the failed command's status as flmbox's own.
func commandFailed(what string, err error, stderr string) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("%s: %s: %s", what, ee.String(), lastLines(stderr, 5))
	}
	return fmt.Errorf("%s: %w: %s", what, err, lastLines(stderr, 5))
}

// checkOutput fails unless a measured call printed exactly wantOut.
func checkOutput(what, got, wantOut string) error {
	if got != wantOut {
		return fmt.Errorf("check the output of %s: got %q, want %q", what, got, wantOut)
	}
	return nil
}

// commandLine is cmd's command line, its first 8 words at most, for errors.
func commandLine(cmd *exec.Cmd) string {
	args := cmd.Args
	if len(args) > 8 {
		args = append(slices.Clip(args[:8]), "…")
	}
	return strings.Join(args, " ")
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
