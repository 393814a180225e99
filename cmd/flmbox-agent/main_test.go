package main

import (
	"strings"
	"testing"
)

// TestRunRefusesBadArguments checks the errors that come before the agent
// touches its process or listens.
func TestRunRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: flmbox-agent --socket PATH"},
		{[]string{"--socket", "/nonexistent/agent.sock", "extra"}, "usage: flmbox-agent --socket PATH"},
		{[]string{"--socket", "/nonexistent/agent.sock", "--limits", "{"}, "--limits: unexpected end of JSON input"},
		{[]string{"--socket", "/nonexistent/agent.sock", "--memory-budget", "lots"}, `invalid value "lots" for flag -memory-budget`},
		{[]string{"--nope"}, "flag provided but not defined: -nope; usage: flmbox-agent"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	if err := run([]string{"-h"}); err != nil {
		t.Errorf("run(-h) = %v, want the usage and no error", err)
	}
}
