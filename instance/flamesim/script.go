package flamesim

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/flmbox/flmbox/instance/flamepb"
)

// Script is a task's input as flamepy.tools.Sandbox sends it for a snippet:
// flmexec's script, {"language":LANGUAGE,"code":CODE,"input":null}, compact.
// Invalid UTF-8 in code becomes U+FFFD, as in any JSON string.
func Script(language, code string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	// Strings and a null cannot fail to encode.
	enc.Encode(struct {
		Language string `json:"language"`
		Code     string `json:"code"`
		Input    []int  `json:"input"`
	}{Language: language, Code: code})
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// Output is a task's output as `flmbox instance` answers it: flmexec's
// {"data": stdout as an array of byte numbers}, which flamepy decodes as
// bytes(data), and the rest of the snippet's result.
type Output struct {
	// Data is the snippet's stdout, byte for byte.
	Data       []byte  `json:"data"`
	ExitCode   int     `json:"exit_code"`
	Stdout     string  `json:"stdout"` // as valid UTF-8
	Stderr     string  `json:"stderr"` // as valid UTF-8
	TimedOut   bool    `json:"timed_out"`
	OOMKilled  bool    `json:"oom_killed"`
	DurationMS float64 `json:"duration_ms"`
}

// UnmarshalJSON reads the output's JSON; data must be null or an array of
// numbers 0 to 255. Keys it does not know are ignored.
func (o *Output) UnmarshalJSON(b []byte) error {
	type plain Output // without this method
	var v struct {
		plain
		Data []int `json:"data"` // shadows plain's
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*o = Output(v.plain)
	o.Data = nil
	if v.Data != nil {
		o.Data = make([]byte, len(v.Data))
	}
	for i, n := range v.Data {
		if n < 0 || n > 255 {
			return fmt.Errorf("data: byte %d is %d, not 0 to 255", i, n)
		}
		o.Data[i] = byte(n)
	}
	return nil
}

// Answer is what the Instance service answers: *flamepb.Result and
// *flamepb.TaskResult.
type Answer interface {
	GetReturnCode() int32
	GetMessage() string
}

// Check returns nil if a's return code is 0, else an error with its code
// and message.
func Check(a Answer) error {
	if a.GetReturnCode() == 0 {
		return nil
	}
	return fmt.Errorf("return code %d: %s", a.GetReturnCode(), a.GetMessage())
}

// DecodeOutput returns the output of a task that ran (its snippet may
// still have failed: see ExitCode); a task that did not run (Check) or an
// output that is not Output's JSON is an error.
func DecodeOutput(res *flamepb.TaskResult) (*Output, error) {
	if err := Check(res); err != nil {
		return nil, fmt.Errorf("the task did not run: %w", err)
	}
	var o Output
	if err := json.Unmarshal(res.GetOutput(), &o); err != nil {
		return nil, fmt.Errorf("decode the task's output %.200q: %w", res.GetOutput(), err)
	}
	return &o, nil
}
