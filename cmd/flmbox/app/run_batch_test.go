package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBatchRefusesBeforeRunning: bad batches and flags are refused, exit
// 125, before any sandbox is looked up.
func TestBatchRefusesBeforeRunning(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		body  string
		flags []string
		want  string
	}{
		{`{"timeout": "soon", "codes": ["print(1)"]}`, nil, `code 0: timeout "soon": want a number of seconds or a duration`},
		{`{"codes": [{"code": "print(1)", "timeout": 1e12}]}`, nil, "code 0: timeout 1e12: want"},
		{`{"codes": ["print(1)"]}`, []string{"--timeout", "1000000h"}, "code 0: timeout 1000000h0m0s: want more than 0 and at most 24h0m0s"},
		{`{"codes": ["print(1)"]}`, []string{"--timeout", "0s"}, "--timeout 0s: want a positive duration such as 30s"},
		{`{"codes": ["puts 1"]}`, []string{"-l", "ruby"}, `code 0: language "ruby"`},
		{`{"codes": ["print(1)"]}`, []string{"--reset"}, "--reset does not apply to --batch"},
	} {
		p := filepath.Join(dir, "batch.json")
		if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		args := append([]string{"flmbox", "--root", t.TempDir(), "run", "--sandbox", "s1", "--batch", p}, tc.flags...)
		if code := Run(t.Context(), args, &stdout, &stderr); code != 125 || stdout.Len() != 0 || !strings.Contains(stderr.String(), "flmbox: "+tc.want) {
			t.Errorf("%s %v: exit %d, stdout %q, stderr %q, want %q", tc.body, tc.flags, code, stdout.String(), stderr.String(), tc.want)
		}
	}
	// --parallel without --batch is refused, not ignored.
	var stdout, stderr bytes.Buffer
	code := Run(t.Context(), []string{"flmbox", "--root", t.TempDir(), "run", "--sandbox", "s1", "--parallel", "2", "-c", "print(1)"}, &stdout, &stderr)
	if code != 125 || !strings.Contains(stderr.String(), "--parallel applies to --batch FILE only") {
		t.Errorf("--parallel: exit %d, stderr %q", code, stderr.String())
	}
}
