package app

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/sandbox"
)

// TestRunCallbackRefusedBeforeRunning: --callback names a socket, checked
// before the sandbox is even looked up (exit 125, with what to do), and its
// limits are refused out of bounds or without --callback; with --batch too.
func TestRunCallbackRefusedBeforeRunning(t *testing.T) {
	dir, err := os.MkdirTemp("", "cb") // short: a socket's path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	batch := filepath.Join(dir, "batch.json")
	if err := os.WriteFile(batch, []byte(`{"codes": ["print(1)"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  []string // in stderr; nil: the socket passed, the missing sandbox is named
	}{
		{"missing", []string{"--callback", filepath.Join(dir, "nosuch")}, []string{"no such file or directory", "--callback names the Unix socket a server of yours listens on: start it first"}},
		{"a regular file", []string{"--callback", file}, []string{file + " is a regular file, not a socket", "start it first, or fix the path"}},
		{"a directory", []string{"--callback", dir}, []string{dir + " is a directory, not a socket"}},
		{"empty", []string{"--callback="}, []string{"--callback: want the path of a Unix socket"}},
		{"env without --callback", []string{"--callback-env", "X"}, []string{"--callback-env applies with --callback HOST_SOCKET only"}},
		{"conns without --callback", []string{"--callback-conns", "5"}, []string{"--callback-conns applies with --callback"}},
		{"zero conns", []string{"--callback", sock, "--callback-conns", "0"}, []string{"--callback-conns 0: want 1 to 1024"}},
		{"too many conns", []string{"--callback", sock, "--callback-conns", "1025"}, []string{"--callback-conns 1025: want 1 to 1024"}},
		{"bytes", []string{"--callback", sock, "--callback-bytes", "17GiB"}, []string{"--callback-bytes 17GiB: want at most 16GiB"}},
		{"bad bytes", []string{"--callback", sock, "--callback-bytes", "lots"}, []string{`--callback-bytes "lots": want a size`}},
		{"idle", []string{"--callback", sock, "--callback-idle", "25h"}, []string{"--callback-idle 25h0m0s: want 1ms to 24h0m0s"}},
		{"a bad variable name", []string{"--callback", sock, "--callback-env", "A-B"}, []string{`callback variable "A-B": want a name`}},
		{"a socket", []string{"--callback", sock, "--callback-env", "HERMES_RPC_SOCKET", "--callback-env", "B", "--callback-conns", "3", "--callback-bytes", "1k", "--callback-idle", "1s"}, nil},
	} {
		for _, mode := range [][]string{{"-c", "print(1)"}, {"--batch", batch}} {
			t.Run(tc.name+mode[0], func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				args := append(append([]string{"flmbox", "--root", t.TempDir(), "run", "--sandbox", "s1"}, tc.flags...), mode...)
				code := Run(t.Context(), args, &stdout, &stderr)
				if tc.want == nil && mode[0] == "--batch" {
					// The socket passed: the snippet fails, in the array.
					if code != 0 || !strings.Contains(stdout.String(), `no sandbox \"s1\"`) {
						t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
					}
					return
				}
				if code != 125 || stdout.Len() != 0 {
					t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
				}
				want := tc.want
				if want == nil {
					want = []string{`sandbox "s1"`}
				} else if strings.Contains(stderr.String(), `sandbox "s1"`) {
					t.Errorf("stderr %q: the sandbox was looked up", stderr.String())
				}
				for _, w := range want {
					if !strings.Contains(stderr.String(), w) {
						t.Errorf("stderr %q: want %q", stderr.String(), w)
					}
				}
			})
		}
	}
}

// TestCallbackDefaults: the flags' defaults are sandbox's. (The flmbox
// command's warm calls cannot import sandbox: the defaults are written twice,
// and this test keeps them one.)
func TestCallbackDefaults(t *testing.T) {
	if runcmd.DefaultTimeout != sandbox.DefaultTimeout {
		t.Errorf("--timeout's default %s; a Request's %s", runcmd.DefaultTimeout, sandbox.DefaultTimeout)
	}
	if n, err := parseSize("--max-output", runcmd.DefaultMaxOutput); err != nil || n != sandbox.DefaultMaxOutput {
		t.Errorf("--max-output's default %s is %d, %v; a Request's %d", runcmd.DefaultMaxOutput, n, err, sandbox.DefaultMaxOutput)
	}
	if n, err := parseSize("--callback-bytes", runcmd.DefaultCallbackBytes); err != nil || n != sandbox.DefaultCallbackBytes {
		t.Errorf("--callback-bytes' default %s is %d, %v; the protocol's %d", runcmd.DefaultCallbackBytes, n, err, sandbox.DefaultCallbackBytes)
	}
}
