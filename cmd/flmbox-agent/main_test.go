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

// TestParseArgsSpares checks the values of --spares: a boolean flag that
// also takes lazy.
func TestParseArgsSpares(t *testing.T) {
	for _, tc := range []struct {
		args         []string
		spares, lazy bool
	}{
		{nil, true, false},
		{[]string{"--spares"}, true, false},
		{[]string{"--spares=true"}, true, false},
		{[]string{"--spares=false"}, false, false},
		{[]string{"--spares=0"}, false, false},
		{[]string{"--spares=lazy"}, true, true},
		{[]string{"--spares=lazy", "--spares=false"}, false, false},
	} {
		a, socket, err := parseArgs(append([]string{"--socket", "/run/agent.sock"}, tc.args...))
		if err != nil || socket != "/run/agent.sock" {
			t.Fatalf("parseArgs(%q) = %q, %v", tc.args, socket, err)
		}
		if a.Spares != tc.spares || a.LazySpares != tc.lazy {
			t.Errorf("parseArgs(%q): Spares %v, LazySpares %v, want %v, %v", tc.args, a.Spares, a.LazySpares, tc.spares, tc.lazy)
		}
	}
	for _, bad := range []string{"--spares=eager", "--spares=", "--spares=lazily"} {
		_, _, err := parseArgs([]string{"--socket", "/run/agent.sock", bad})
		if err == nil || !strings.Contains(err.Error(), "want true, false or lazy") {
			t.Errorf("parseArgs(%q) = %v, want an error naming the values", bad, err)
		}
	}
}
