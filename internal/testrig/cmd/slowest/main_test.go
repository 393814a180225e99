package main

import (
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	in := `{"Action":"start","Package":"x/p"}
{"Action":"run","Package":"x/p","Test":"TestA"}
{"Action":"output","Package":"x/p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"x/p","Test":"TestA","Output":"    a_test.go:1: quiet\n"}
{"Action":"output","Package":"x/p","Test":"TestA","Output":"--- PASS: TestA (2.00s)\n"}
{"Action":"pass","Package":"x/p","Test":"TestA","Elapsed":2}
{"Action":"run","Package":"x/p","Test":"TestB/sub"}
{"Action":"output","Package":"x/p","Test":"TestB/sub","Output":"    b_test.go:2: loud\n"}
{"Action":"output","Package":"x/p","Test":"TestB/sub","Output":"    --- FAIL: TestB/sub (0.50s)\n"}
{"Action":"fail","Package":"x/p","Test":"TestB/sub","Elapsed":0.5}
{"Action":"output","Package":"x/p","Test":"TestB","Output":"--- FAIL: TestB (5.00s)\n"}
{"Action":"fail","Package":"x/p","Test":"TestB","Elapsed":5}
{"Action":"output","Package":"x/p","Test":"TestC","Output":"    c_test.go:3: hung\n"}
{"Action":"output","Package":"x/p","Output":"PASS\n"}
{"Action":"output","Package":"x/p","Output":"FAIL\tx/p\t7.0s\n"}
{"Action":"fail","Package":"x/p","Elapsed":7}
not json
`
	var out strings.Builder
	failed, err := run(strings.NewReader(in), &out, 15)
	if err != nil || !failed {
		t.Fatalf("run: failed %v, err %v", failed, err)
	}
	want := `    b_test.go:2: loud
    --- FAIL: TestB/sub (0.50s)
--- FAIL: TestB (5.00s)
FAIL	x/p	7.0s
not json
--- TestC did not end:
    c_test.go:3: hung
slowest tests:
     5.0s  TestB (p)
     2.0s  TestA (p)
`
	if got := out.String(); got != want {
		t.Errorf("printed:\n%s\nwant:\n%s", got, want)
	}

	out.Reset()
	failed, err = run(strings.NewReader(in[:strings.Index(in, `{"Action":"run","Package":"x/p","Test":"TestB/sub"}`)]), &out, 1)
	if err != nil || failed || out.String() != "slowest tests:\n     2.0s  TestA (p)\n" {
		t.Errorf("a passing run: failed %v, err %v, printed %q", failed, err, out.String())
	}
}
