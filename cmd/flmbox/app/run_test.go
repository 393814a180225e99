package app

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunRefusesCreateFlagsWithSandbox: a flag that configures a new sandbox
// is refused with --sandbox, before the sandbox is even looked up, rather
// than silently ignored.
func TestRunRefusesCreateFlagsWithSandbox(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string // the flag named in the error; "" if the call must pass the check
	}{
		{[]string{"--pip", "six"}, "--pip"},
		{[]string{"--memory", "1g"}, "--memory"},
		{[]string{"--network", "host"}, "--network"},
		{[]string{"--network", "none"}, "--network"}, // set, even to the default
		{[]string{"-e", "K=V"}, ""},                  // the call's environment, not the sandbox's
		{[]string{"--offline"}, "--offline"},
		{[]string{"--batch", "-", "--cpus", "2"}, "--cpus"},
		{[]string{"--timeout", "5s", "-l", "shell"}, ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"flmbox", "--root", t.TempDir(), "run", "--sandbox", "s1"}, tc.args...)
			if !strings.Contains(strings.Join(tc.args, " "), "--batch") {
				args = append(args, "-c", "print(1)")
			}
			code := Run(t.Context(), args, &stdout, &stderr)
			if code != 125 || stdout.Len() != 0 {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
			}
			refused := strings.Contains(stderr.String(), "configures a new sandbox")
			if tc.flag == "" {
				if refused || !strings.Contains(stderr.String(), `sandbox "s1"`) {
					t.Fatalf("stderr %q: want the missing sandbox named, no refused flag", stderr.String())
				}
				return
			}
			if !refused || !strings.Contains(stderr.String(), tc.flag+" configures") || !strings.Contains(stderr.String(), "flmbox sandbox create") {
				t.Fatalf("stderr %q: want %s refused with what to do", stderr.String(), tc.flag)
			}
		})
	}
}
