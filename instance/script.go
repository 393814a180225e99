package instance

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/sandbox"
)

// Script is a task's input: flmexec's, as Flame's Python client sends it
// (JSON of Rust's serde: bytes are arrays of numbers), and a timeout.
type Script struct {
	// Language is "python" or "shell", in any case.
	Language string `json:"language"`
	// Runtime names the interpreter, in flmexec's forms and more: for
	// Python a version ("3.11", or "python3.11"), a command in the
	// image's PATH or an absolute path in the image (default: the image's
	// python3); for shell a shell's name or path, such as "sh", "zsh" or
	// "/bin/bash" (default: bash, or the image's /bin/sh if it has no
	// bash). Spaces around it are ignored. One the image lacks fails the
	// task, naming the Pythons it has.
	Runtime string `json:"runtime,omitempty"`
	// Code is the snippet, run as a file, main.py or main.sh, in a new
	// directory under /tmp (its __file__, sys.argv[0] or $0), with /tmp
	// as the working directory.
	Code string `json:"code"`
	// Input is the snippet's stdin (null: EOF at once).
	Input Bytes `json:"input"`
	// Timeout is the task's timeout in seconds (default: the session's).
	Timeout float64 `json:"timeout,omitempty"`
	// Env are environment variables of this task only, added to the
	// session's.
	Env map[string]string `json:"env,omitempty"`
}

// Bytes are bytes as serde's JSON has them: an array of numbers.
type Bytes []byte

// MarshalJSON writes b as an array of numbers.
func (b Bytes) MarshalJSON() ([]byte, error) {
	var out bytes.Buffer
	out.Grow(4*len(b) + 2)
	out.WriteByte('[')
	for i, c := range b {
		if i > 0 {
			out.WriteByte(',')
		}
		out.WriteString(strconv.Itoa(int(c)))
	}
	out.WriteByte(']')
	return out.Bytes(), nil
}

// UnmarshalJSON reads an array of numbers 0 to 255, or null.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = nil
		return nil
	}
	var ns []int
	if err := json.Unmarshal(data, &ns); err != nil {
		return fmt.Errorf("want an array of bytes: %w", err)
	}
	out := make([]byte, len(ns))
	for i, n := range ns {
		if n < 0 || n > 255 {
			return fmt.Errorf("byte %d is %d, not 0 to 255", i, n)
		}
		out[i] = byte(n)
	}
	*b = out
	return nil
}

// The files that a task's code runs as, flmexec's: python3 main.py, bash
// main.sh.
const (
	pythonFile = "main.py"
	shellFile  = "main.sh"
)

// defaultShell is the interpreter of a shell task that names none, as in
// flmexec; an image without it runs such tasks with its /bin/sh (see
// Server.invoke).
const defaultShell = "bash"

// task is a task's input as a call.
type task struct {
	req sandbox.Request
	// runtime is the runtime the task (or its session) asked for, for
	// messages; "" if none.
	runtime string
	// defaultShell says that req.Interpreter is defaultShell because
	// nothing named a shell.
	defaultShell bool
}

// parseScript reads a task's input into a call, with the session's
// defaults: its code runs as main.py or main.sh (Request.File), under the
// runtime that the task or else its session names (see interpreter).
func parseScript(input []byte, defaults taskDefaults) (task, error) {
	timeout := defaults.Timeout
	var sc Script
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return task{}, fmt.Errorf("task input: want a JSON script {\"language\", \"code\", \"input\"}: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	lang := strings.ToLower(strings.TrimSpace(sc.Language))
	if lang != sandbox.Python && lang != sandbox.Shell {
		return task{}, fmt.Errorf("language %q: want python or shell: %w", sc.Language, errdefs.ErrInvalidArgument)
	}
	if sc.Timeout < 0 {
		return task{}, fmt.Errorf("timeout %g: want seconds, more than 0: %w", sc.Timeout, errdefs.ErrInvalidArgument)
	}
	if sc.Timeout > 0 {
		timeout = time.Duration(sc.Timeout * float64(time.Second))
	}
	t := task{runtime: cmp.Or(strings.TrimSpace(sc.Runtime), strings.TrimSpace(defaults.Runtime))}
	t.req = sandbox.Request{Language: lang, Code: sc.Code, Timeout: timeout, MaxOutput: TaskMaxOutput,
		Stdin: sc.Input, Interpreter: interpreter(lang, t.runtime), File: pythonFile}
	if lang == sandbox.Shell {
		t.req.File = shellFile
		t.defaultShell = t.runtime == ""
	}
	for _, k := range slices.Sorted(maps.Keys(sc.Env)) {
		t.req.Env = append(t.req.Env, k+"="+sc.Env[k])
	}
	if err := t.req.Validate(); err != nil {
		return task{}, fmt.Errorf("task input: %w", err)
	}
	return t, nil
}

// interpreter is the sandbox.Request.Interpreter of runtime (trimmed) for
// lang, as flmexec reads it: for Python, a version (3.11, or python3.11 as
// flmexec also takes it: a leading "python" goes), a command or an absolute
// path; "" or "python" are the image's python3 (flmexec's default is 3.12,
// through uv: flmbox has no uv, and takes the image's own). For shell, a
// shell's name or path; "" is bash, as in flmexec.
func interpreter(lang, runtime string) string {
	if lang == sandbox.Shell {
		return cmp.Or(runtime, defaultShell)
	}
	if v, ok := strings.CutPrefix(runtime, "python"); ok && (v == "" || sandbox.PythonVersion(v) != "") {
		return v
	}
	return runtime
}
