package app

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBatchTimeout: a batch's timeout is a number of seconds or a duration
// as --timeout takes it; absent, null or 0 leaves it to the next level.
func TestBatchTimeout(t *testing.T) {
	for _, tc := range []struct {
		json string
		want time.Duration // 0: not set
		bad  bool
	}{
		{`{}`, 0, false},
		{`{"timeout": null}`, 0, false},
		{`{"timeout": 0}`, 0, false},
		{`{"timeout": 30}`, 30 * time.Second, false},
		{`{"timeout": 0.25}`, 250 * time.Millisecond, false},
		{`{"timeout": "1.5s"}`, 1500 * time.Millisecond, false},
		{`{"timeout": "2m"}`, 2 * time.Minute, false},
		{`{"timeout": "24h"}`, 24 * time.Hour, false},
		{`{"timeout": 86401}`, 0, true},
		{`{"timeout": "1000000h"}`, 0, true},
		{`{"timeout": 1e300}`, 0, true},
		{`{"timeout": -1}`, 0, true},
		{`{"timeout": "0s"}`, 0, true},
		{`{"timeout": "10"}`, 0, true}, // a string is a duration: "10" has no unit
		{`{"timeout": true}`, 0, true},
	} {
		var item batchItem
		if err := json.Unmarshal([]byte(tc.json), &item); err != nil {
			t.Fatalf("%s: %v", tc.json, err)
		}
		if tc.want == 0 && !tc.bad {
			if item.Timeout.raw != "" {
				t.Errorf("%s: set (%q)", tc.json, item.Timeout.raw)
			}
			continue
		}
		d, err := item.Timeout.duration()
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), "want a number of seconds or a duration such as \"1.5s\", more than 0 and at most 24h0m0s") {
				t.Errorf("%s: %v, %v: want it refused", tc.json, d, err)
			}
			continue
		}
		if err != nil || d != tc.want {
			t.Errorf("%s: %v, %v: want %v", tc.json, d, err, tc.want)
		}
	}
}

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
