package wire

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestValidate(t *testing.T) {
	ok := func(edit func(r *Request)) *Request {
		r := &Request{Version: ProtocolVersion, Language: LanguagePython, Code: "print(1)", TimeoutMS: 1000}
		edit(r)
		return r
	}
	for _, tc := range []struct {
		name string
		req  *Request
		want string // "" for valid
	}{
		{"python", ok(func(r *Request) {}), ""},
		{"shell", ok(func(r *Request) { r.Language = LanguageShell }), ""},
		{"empty code", ok(func(r *Request) { r.Code = "" }), ""},
		{"largest code", ok(func(r *Request) { r.Code = strings.Repeat("#", MaxCodeSize) }), ""},
		{"largest shell code", ok(func(r *Request) { r.Language, r.Code = LanguageShell, strings.Repeat("#", MaxShellCodeSize) }), ""},
		{"max timeout", ok(func(r *Request) { r.TimeoutMS = MaxTimeout.Milliseconds() }), ""},
		{"max output and limits", ok(func(r *Request) {
			r.MaxOutput, r.Limits = MaxMaxOutput, Limits{Procs: 10, FileBytes: 1}
		}), ""},
		{"largest stdin, env, interpreter", ok(func(r *Request) {
			r.Stdin, r.Env, r.Interpreter = make([]byte, MaxStdinSize), []string{"A=" + strings.Repeat("x", MaxEnvSize-2)}, "python3.11"
		}), ""},
		{"empty env value", ok(func(r *Request) { r.Env = []string{"A="} }), ""},
		{"ping", PingRequest(), ""},
		{"nil", nil, "no request"},
		{"callback variable PATH", ok(func(r *Request) { r.Callback = &Callback{Env: []string{"PATH"}} }), `callback variable "PATH": a name the shell`},
		{"callback variable LD_PRELOAD", ok(func(r *Request) { r.Callback = &Callback{Env: []string{"LD_PRELOAD"}} }), `callback variable "LD_PRELOAD"`},
		{"callback variable 1X", ok(func(r *Request) { r.Callback = &Callback{Env: []string{"1X"}} }), `callback variable "1X": want a name`},
		{"callback conns", ok(func(r *Request) { r.Callback = &Callback{MaxConns: MaxCallbackConns + 1} }), "callback connections 1025"},
		{"stdin over 8 MiB", ok(func(r *Request) { r.Stdin = make([]byte, MaxStdinSize+1) }), "stdin is 8388609 bytes, over the limit of 8388608"},
		{"env without =", ok(func(r *Request) { r.Env = []string{"A"} }), `env "A": want NAME=VALUE`},
		{"env without name", ok(func(r *Request) { r.Env = []string{"=x"} }), `env "=x": want NAME=VALUE`},
		{"env with NUL", ok(func(r *Request) { r.Env = []string{"A=\x00"} }), `env "A": holds a NUL byte`},
		{"env over 64 KiB", ok(func(r *Request) { r.Env = []string{"A=" + strings.Repeat("x", MaxEnvSize-1)} }), "env holds 65537 bytes, over the limit of 65536"},
		{"interpreter path", ok(func(r *Request) { r.Interpreter = "/usr/bin/python3" }), ""},
		{"python version", ok(func(r *Request) { r.Interpreter = "3.12" }), ""},
		{"python version for shell", ok(func(r *Request) { r.Language, r.Interpreter = LanguageShell, "3.12" }), `interpreter "3.12": a version names a Python`},
		{"relative interpreter path", ok(func(r *Request) { r.Interpreter = "bin/python3" }), `interpreter "bin/python3": want a command name`},
		{"unclean interpreter path", ok(func(r *Request) { r.Interpreter = "/usr/bin/../bin/python3" }), `want a clean absolute path`},
		{"interpreter /", ok(func(r *Request) { r.Interpreter = "/" }), `want a clean absolute path`},
		{"file", ok(func(r *Request) { r.File = "main.py" }), ""},
		{"shell code over 127 KiB in a file", ok(func(r *Request) {
			r.Language, r.File, r.Code = LanguageShell, "main.sh", strings.Repeat("#", MaxShellCodeSize+1)
		}), ""},
		{"file with a slash", ok(func(r *Request) { r.File = "a/main.py" }), `file name "a/main.py": want a base name`},
		{"file ..", ok(func(r *Request) { r.File = ".." }), `file name "..": want a base name`},
		{"file with NUL", ok(func(r *Request) { r.File = "a\x00" }), `want a base name`},
		{"file name too long", ok(func(r *Request) { r.File = strings.Repeat("a", 256) }), `want a base name`},
		{"interpreter option", ok(func(r *Request) { r.Interpreter = "-c" }), `interpreter "-c": want a command name`},
		{"interpreter with space", ok(func(r *Request) { r.Interpreter = "python3 -I" }), `interpreter "python3 -I"`},
		{"version 0", ok(func(r *Request) { r.Version = 0 }), fmt.Sprintf("request speaks protocol 0, this side speaks %d", ProtocolVersion)},
		{"another version", ok(func(r *Request) { r.Version = ProtocolVersion + 1 }), fmt.Sprintf("request speaks protocol %d, this side speaks %d", ProtocolVersion+1, ProtocolVersion)},
		{"unknown language", ok(func(r *Request) { r.Language = "ruby" }), `language "ruby": want python or shell`},
		{"no language", ok(func(r *Request) { r.Language = "" }), `language "": want python or shell`},
		{"code over 1 MiB", ok(func(r *Request) { r.Code = strings.Repeat("#", MaxCodeSize+1) }), "python code is 1048577 bytes, over the limit of 1048576"},
		{"shell code over 127 KiB", ok(func(r *Request) { r.Language, r.Code = LanguageShell, strings.Repeat("#", MaxShellCodeSize+1) }), "shell code is 130049 bytes"},
		{"NUL byte", ok(func(r *Request) { r.Code = "print(1)\x00" }), "NUL byte at offset 8"},
		{"invalid UTF-8", ok(func(r *Request) { r.Code = "print('\xff')" }), "not valid UTF-8"},
		{"zero timeout", ok(func(r *Request) { r.TimeoutMS = 0 }), "timeout 0s: want more than 0 and at most 24h0m0s"},
		{"negative timeout", ok(func(r *Request) { r.TimeoutMS = -5 }), "timeout -5ms"},
		{"absurd timeout", ok(func(r *Request) { r.TimeoutMS = MaxTimeout.Milliseconds() + 1 }), "timeout 24h0m0.001s"},
		{"huge timeout", ok(func(r *Request) { r.TimeoutMS = 3600000000000 }), "timeout 1000000h0m0s: want more than 0 and at most 24h0m0s"},
		{"beyond a Duration", ok(func(r *Request) { r.TimeoutMS = 1 << 62 }), "timeout 1281023894007h: want"},
		{"negative max output", ok(func(r *Request) { r.MaxOutput = -1 }), "max output -1 bytes"},
		{"huge max output", ok(func(r *Request) { r.MaxOutput = MaxMaxOutput + 1 }), "max output 67108865 bytes"},
		{"negative procs", ok(func(r *Request) { r.Limits.Procs = -1 }), "limits must not be negative"},
		{"negative procs", ok(func(r *Request) { r.Limits.Procs = -1 }), "limits must not be negative"},
		{"negative file size", ok(func(r *Request) { r.Limits.FileBytes = -1 }), "limits must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.req.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Validate = %v, want errdefs.ErrInvalidArgument", err)
			}
		})
	}
}
