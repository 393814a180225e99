package instance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/flmbox/flmbox/sandbox"
)

// captured is what the agent answers of stream, asked to keep max bytes
// (sandbox.Output: a prefix of max/2 and the last max/2 when it is longer).
func captured(stream []byte, max int) sandbox.Output {
	if len(stream) <= max {
		return sandbox.Output{Data: stream, Total: int64(len(stream))}
	}
	return sandbox.Output{Data: stream[:max/2], Tail: stream[len(stream)-max/2:], Total: int64(len(stream)), Truncated: true}
}

// decoded is an output's JSON as flamepy and a client of the extra fields
// read it: data as bytes(data).
type decoded struct {
	Data            numbers `json:"data"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTail      string  `json:"stdout_tail"`
	StderrTail      string  `json:"stderr_tail"`
	StdoutBytes     int64   `json:"stdout_bytes"`
	StderrBytes     int64   `json:"stderr_bytes"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	ExitCode        int     `json:"exit_code"`
}

func (d decoded) data() []byte { return d.Data }

// numbers is a JSON array of numbers from 0 to 255, read as bytes(data)
// reads it. It is parsed here, not by encoding/json's reflection, which
// took most of this package's test time on arrays of a million numbers.
type numbers []byte

// UnmarshalJSON reads b, which json.Unmarshal has checked is JSON.
func (n *numbers) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		*n = nil
		return nil
	}
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return fmt.Errorf("data is not an array: %.20s", b)
	}
	inner := bytes.TrimSpace(b[1 : len(b)-1])
	out := make([]byte, 0, len(inner)/2)
	if len(inner) == 0 {
		*n = out
		return nil
	}
	v, digits := 0, 0
	for i := 0; i <= len(inner); i++ {
		if i == len(inner) || inner[i] == ',' {
			if digits == 0 || v > 255 {
				return fmt.Errorf("data[%d] is not a number from 0 to 255", len(out))
			}
			out = append(out, byte(v))
			v, digits = 0, 0
			continue
		}
		switch c := inner[i]; {
		case c >= '0' && c <= '9' && digits < 3:
			v = v*10 + int(c-'0')
			digits++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		default:
			return fmt.Errorf("data[%d] is not a number from 0 to 255", len(out))
		}
	}
	*n = out
	return nil
}

func decode(t *testing.T, b []byte) decoded {
	t.Helper()
	var d decoded
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("the output is not JSON: %v: %.200s", err, b)
	}
	return d
}

// TestOutputWhole: an output that fits holds all of stdout, in data and
// as text, and says it is whole; the JSON is what newOutput returns.
func TestOutputWhole(t *testing.T) {
	stdout := bytes.Repeat([]byte("a line of text, 0123456789\n"), 30000) // 810 KB: over 200 KiB, under the budget
	stdout = append(stdout, 0xff)
	res := &sandbox.Result{ExitCode: 3, Stdout: captured(stdout, TaskMaxOutput), Stderr: captured([]byte("oops\n"), TaskMaxOutput)}
	out, b := newOutput(res, outputBudget(100))
	d := decode(t, b)
	if !bytes.Equal(d.data(), stdout) || d.StdoutTruncated || d.StdoutBytes != int64(len(stdout)) || d.StdoutTail != "" ||
		d.Stdout != strings.ToValidUTF8(string(stdout), "\uFFFD") || d.Stderr != "oops\n" || d.StderrBytes != 5 || d.StderrTruncated ||
		d.ExitCode != 3 || out.ExitCode != 3 || len(b) > outputBudget(100) {
		t.Fatalf("%d bytes of data of %d, truncated %v, %d bytes of JSON, stderr %q", len(d.Data), len(stdout), d.StdoutTruncated, len(b), d.Stderr)
	}
	if !bytes.Equal(b, marshal(out)) {
		t.Fatal("the JSON is not the output's")
	}
	// Empty: data is [], never null.
	if _, b := newOutput(&sandbox.Result{}, outputBudget(0)); !bytes.HasPrefix(b, []byte(`{"data":[],`)) {
		t.Fatalf("%s", b)
	}
}

// TestOutputTruncated: whatever the bytes, an output over the budget holds
// the longest prefix of stdout that fits (exactly its bytes), says so, and
// holds stdout's last bytes; its JSON is within the budget. The more of it
// a byte takes, the less data holds, never less than a quarter of the
// budget's bytes.
func TestOutputTruncated(t *testing.T) {
	random := make([]byte, 6<<20)
	rand.NewChaCha8([32]byte{1, 2}).Read(random)
	stderr := bytes.Repeat([]byte{2}, 3<<20) // the worst of stderr too
	for _, tc := range []struct {
		name   string
		stream []byte
		least  int // bytes of data at least
	}{
		{"text", bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog 0123456789\n"), 100000), 700 << 10},
		{"control characters", bytes.Repeat([]byte{1}, 5<<20), 330 << 10},
		{"0xff", bytes.Repeat([]byte{0xff}, 5<<20), 500 << 10},
		{"U+2028", bytes.Repeat([]byte("\u2028"), 2<<20), 500 << 10},
		{"quotes and backslashes", bytes.Repeat([]byte(`"\`), 3<<20), 600 << 10},
		{"random", random, 330 << 10},
		{"just over", bytes.Repeat([]byte("0123456789"), 110000), 700 << 10}, // 1.1 MB: under TaskMaxOutput, the agent cuts nothing
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, input := range []int{100, 1 << 20} {
				res := &sandbox.Result{Stdout: captured(tc.stream, TaskMaxOutput), Stderr: captured(stderr, TaskMaxOutput)}
				budget := outputBudget(input)
				out, b := newOutput(res, budget)
				d := decode(t, b)
				data := d.data()
				if len(b) > budget || !bytes.HasPrefix(tc.stream, data) || !d.StdoutTruncated || d.StdoutBytes != int64(len(tc.stream)) ||
					!out.StdoutTruncated || len(out.Data) != len(data) {
					t.Fatalf("input %d: %d bytes of JSON (budget %d), %d bytes of data, a prefix: %v, truncated %v, stdout_bytes %d",
						input, len(b), budget, len(data), bytes.HasPrefix(tc.stream, data), d.StdoutTruncated, d.StdoutBytes)
				}
				if input == 100 && len(data) < tc.least {
					t.Errorf("%d bytes of data, want at least %d", len(data), tc.least)
				}
				// The tail is stdout's last bytes, after data's.
				tail := tc.stream[max(len(data), len(tc.stream)-TaskMaxTail):]
				if d.StdoutTail != strings.ToValidUTF8(string(tail), "\uFFFD") {
					t.Errorf("stdout_tail: %d bytes, want the last %d", len(d.StdoutTail), len(tail))
				}
				if !d.StderrTruncated || d.StderrBytes != 3<<20 || d.Stderr != string(stderr[:TaskMaxStderr]) || d.StderrTail != string(stderr[:TaskMaxTail]) {
					t.Errorf("stderr: truncated %v, %d bytes, %d bytes kept, tail %d", d.StderrTruncated, d.StderrBytes, len(d.Stderr), len(d.StderrTail))
				}
				// The next byte would not have fit (within the tail's
				// slack and the upper bound of a byte).
				_, next, _ := nextChar(tc.stream[len(data):], len(data) > 0 && !utf8.Valid(tc.stream[len(data)-1:len(data)]))
				if next += len(b) + 2*utf8.UTFMax; next <= budget {
					t.Errorf("data could hold more: %d bytes of JSON of %d", len(b), budget)
				}
				t.Logf("input %d: %d KiB of data, %d bytes of JSON", input, len(data)>>10, len(b))
			}
		})
	}
}

// TestOutputStderr: stderr keeps its first TaskMaxStderr bytes and its
// last TaskMaxTail, after those.
func TestOutputStderr(t *testing.T) {
	stderr := []byte(strings.Repeat("x", TaskMaxStderr) + strings.Repeat("y", 10) + "Traceback\nValueError: z\n")
	_, b := newOutput(&sandbox.Result{Stderr: captured(stderr, TaskMaxOutput)}, outputBudget(0))
	d := decode(t, b)
	if d.Stderr != string(stderr[:TaskMaxStderr]) || d.StderrTail != "yyyyyyyyyyTraceback\nValueError: z\n" || !d.StderrTruncated ||
		d.StderrBytes != int64(len(stderr)) || d.StdoutTruncated || d.StdoutTail != "" {
		t.Fatalf("%+v", d)
	}
}

func TestOutputDataIsAnArrayOfNumbers(t *testing.T) {
	b, err := json.Marshal(Output{Data: Bytes("hi\xff")})
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Data []int }
	if err := json.Unmarshal(b, &v); err != nil || len(v.Data) != 3 || v.Data[0] != 'h' || v.Data[2] != 255 {
		t.Fatalf("%s: %v %v", b, v, err)
	}
}
