package bench

import (
	"slices"
	"strings"
	"testing"
)

func TestParseDownload(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      float64
		err       string
	}{
		{name: "ok", out: "0.25 104857600\n", want: 250},
		{name: "exponent", out: "1.5e-01 104857600\n", want: 150},
		{name: "short", out: "0.25 1048576\n", err: "1048576 bytes, want 104857600"},
		{name: "no bytes", out: "0.25\n", err: "read the download's time"},
		{name: "extra line", out: "0.25 104857600\nnoise\n", err: "read the download's time"},
		{name: "zero time", out: "0 104857600\n", err: "read the download's time"},
		{name: "not a number", out: "fast 104857600\n", err: "read the download's time"},
		{name: "empty", out: "", err: "read the download's time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDownload(tc.out, downloadBytes)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseDownload(%q) = %v, %v; want an error with %q", tc.out, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseDownload(%q) = %v, %v; want %v", tc.out, got, err, tc.want)
			}
		})
	}
}

func TestParseConnects(t *testing.T) {
	for _, tc := range []struct {
		name, out     string
		warmup, trips int
		want          []float64
		err           string
	}{
		{name: "warm-up dropped", out: "900000\n800000\n250000\n1500000\n", warmup: 2, trips: 2, want: []float64{0.25, 1.5}},
		{name: "no warm-up", out: "120000\n", warmup: 0, trips: 1, want: []float64{0.12}},
		{name: "one short", out: "1\n2\n", warmup: 1, trips: 2, err: "2 lines, want 3"},
		{name: "one more", out: "1\n2\n3\n4\n", warmup: 1, trips: 2, err: "4 lines, want 3"},
		{name: "not a number", out: "1\nx\n3\n", warmup: 1, trips: 2, err: "line 2"},
		{name: "zero", out: "1\n0\n", warmup: 0, trips: 2, err: "line 2"},
		{name: "empty", out: "", warmup: 0, trips: 1, err: "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseConnects(tc.out, tc.warmup, tc.trips)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseConnects(%q) = %v, %v; want an error with %q", tc.out, got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("parseConnects(%q) = %v, %v; want %v", tc.out, got, err, tc.want)
			}
		})
	}
}

// TestEgressCode checks that the snippets name what they must: the
// server's file, no proxy, as many connects as the parser reads.
func TestEgressCode(t *testing.T) {
	d := downloadCode("http://198.51.100.10/bytes/104857600")
	for _, want := range []string{`"http://198.51.100.10/bytes/104857600"`, "ProxyHandler({})", "perf_counter()", "print(time.perf_counter() - start, got)"} {
		if !strings.Contains(d, want) {
			t.Errorf("downloadCode lacks %q:\n%s", want, d)
		}
	}
	c := connectCode(internetAddr, 80, connectWarmup, 50)
	for _, want := range []string{"range(55)", `s.connect(("198.51.100.10", 80))`, "perf_counter_ns()"} {
		if !strings.Contains(c, want) {
			t.Errorf("connectCode lacks %q:\n%s", want, c)
		}
	}
}
