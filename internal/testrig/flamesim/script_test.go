package flamesim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/instance/flamepb"
)

func TestScript(t *testing.T) {
	for _, tc := range []struct {
		task Task
		want string
	}{
		// Python's json.dumps of flamepy.tools.Sandbox's payload, as
		// python3 -c 'import json; print(json.dumps(...))' writes them.
		{Task{Language: "python", Code: "print(1)"}, `{"language": "python", "code": "print(1)", "input": null}`},
		{Task{Language: "shell", Code: "echo 'a' > /tmp/b && cat <x"}, `{"language": "shell", "code": "echo 'a' > /tmp/b && cat <x", "input": null}`},
		{Task{Language: "python", Code: "print(\"é\\n\")\n\x01\x7f\b\f\t\r😀"},
			`{"language": "python", "code": "print(\"\u00e9\\n\")\n\u0001\u007f\b\f\t\r\ud83d\ude00", "input": null}`},
		{Task{Language: "python", Runtime: "3.11", Code: "1", Input: []byte("hi")}, `{"language": "python", "code": "1", "input": [104, 105], "runtime": "3.11"}`},
		{Task{Language: "python", Code: "1", Input: []byte{}}, `{"language": "python", "code": "1", "input": []}`},
	} {
		got := tc.task.JSON()
		if string(got) != tc.want {
			t.Errorf("%+v: %s, want %s", tc.task, got, tc.want)
		}
		var back struct {
			Language, Code, Runtime string
			Input                   []int
		}
		if err := json.Unmarshal(got, &back); err != nil || back.Code != tc.task.Code || back.Runtime != tc.task.Runtime || len(back.Input) != len(tc.task.Input) {
			t.Errorf("%s reads back as %+v: %v", got, back, err)
		}
	}
	if got := string(Script("python", "print(1)")); got != `{"language": "python", "code": "print(1)", "input": null}` {
		t.Errorf("Script: %s", got)
	}
}

func TestDecodeOutput(t *testing.T) {
	out := func(s string) *flamepb.TaskResult { return &flamepb.TaskResult{Output: []byte(s)} }
	msg := "no session is entered"
	for _, tc := range []struct {
		name string
		res  *flamepb.TaskResult
		want *Output
		err  string
	}{
		{"bytes", out(`{"data":[0,104,255,10],"exit_code":3,"stdout":"\u0000h\ufffd\n","stderr":"x","timed_out":true,"oom_killed":true,"duration_ms":1.5,"later":1}`),
			&Output{Data: []byte{0, 'h', 255, '\n'}, ExitCode: 3, Stdout: "\x00h\ufffd\n", Stderr: "x", TimedOut: true, OOMKilled: true, DurationMS: 1.5}, ""},
		{"empty", out(`{"data":[],"exit_code":0}`), &Output{Data: []byte{}}, ""},
		{"null", out(`{"data":null}`), &Output{}, ""},
		{"not a byte", out(`{"data":[256]}`), nil, "byte 0 is 256"},
		{"negative", out(`{"data":[1,-1]}`), nil, "byte 1 is -1"},
		{"base64", out(`{"data":"aGk="}`), nil, "cannot unmarshal"},
		{"not json", out(`not json`), nil, "decode the task's output"},
		{"did not run", &flamepb.TaskResult{ReturnCode: 1, Message: &msg}, nil, "did not run: return code 1: no session is entered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeOutput(tc.res)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tc.want)
			if string(gj) != string(wj) || (got.Data == nil) != (tc.want.Data == nil) {
				t.Errorf("got %s, want %s", gj, wj)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	msg := "session \"a\" is entered already"
	if err := Check(&flamepb.Result{}); err != nil {
		t.Errorf("return code 0: %v", err)
	}
	if err := Check(&flamepb.Result{ReturnCode: 1, Message: &msg}); err == nil || err.Error() != "return code 1: "+msg {
		t.Errorf("return code 1: %v", err)
	}
}
