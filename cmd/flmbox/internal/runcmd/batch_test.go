package runcmd

import (
	"encoding/json"
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
		var item BatchItem
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
