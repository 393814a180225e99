package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSplitSandboxPath: NAME:PATH names a path in a sandbox when NAME is a
// valid sandbox name with no '/' before the ':', as docker cp reads it;
// anything else is a host path.
func TestSplitSandboxPath(t *testing.T) {
	for _, tc := range []struct {
		arg, name, path string
		ok              bool
	}{
		{"work:/tmp/in/", "work", "/tmp/in/", true},
		{"work:/tmp/out", "work", "/tmp/out", true},
		{"demo-1_x.y:/tmp", "demo-1_x.y", "/tmp", true},
		{"work:", "work", "", true},
		{"work:relative", "work", "relative", true},
		{"work:/tmp/a:b", "work", "/tmp/a:b", true},
		{strings.Repeat("a", 64) + ":/tmp", strings.Repeat("a", 64), "/tmp", true},
		{strings.Repeat("a", 65) + ":/tmp", "", "", false},
		{"./data.csv", "", "", false},
		{"data.csv", "", "", false},
		{"-", "", "", false},
		{"/abs/path:with-colon", "", "", false},
		{"./work:/tmp", "", "", false},
		{"dir/work:/tmp", "", "", false},
		{":/tmp", "", "", false},
		{".hidden:/tmp", "", "", false},
		{"-flag:/tmp", "", "", false},
		{"bad name:/tmp", "", "", false},
		{"..:/tmp", "", "", false},
	} {
		name, p, ok := splitSandboxPath(tc.arg)
		if name != tc.name || p != tc.path || ok != tc.ok {
			t.Errorf("splitSandboxPath(%q) = %q, %q, %v; want %q, %q, %v", tc.arg, name, p, ok, tc.name, tc.path, tc.ok)
		}
	}
}

// TestCpRefuses: cp refuses, exit 125 and a message on stderr, what it
// cannot do, before it copies anything; and a sandbox that is not there.
func TestCpRefuses(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	f := filepath.Join(host, "f")
	if err := os.WriteFile(f, []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{fifo, "s:/tmp/"}, fifo + " is a FIFO: only regular files, directories and symbolic links are copied"},
		{[]string{"/dev/null", "s:/tmp/"}, "/dev/null is a character device"},
		{[]string{"/dev/zero", "s:/tmp/x"}, "/dev/zero is a character device"},
		{[]string{f}, "cp takes SRC and DST"},
		{[]string{f, "a:/tmp", "b:/tmp"}, "cp takes SRC and DST"},
		{[]string{f, filepath.Join(host, "g")}, "give one of SRC and DST as NAME:PATH"},
		{[]string{"a:/tmp/x", "b:/tmp/y"}, "give one of SRC and DST as NAME:PATH"},
		{[]string{"-", "-"}, "give one of SRC and DST as NAME:PATH"},
		{[]string{"--max-size", "lots", f, "s:/tmp/"}, `--max-size "lots"`},
		{[]string{"--max-size", "0", f, "s:/tmp/"}, `--max-size "0"`},
		{[]string{f, "nosuch:/tmp/x"}, `no sandbox "nosuch"`},
		{[]string{"nosuch:/tmp/x", host}, `no sandbox "nosuch"`},
		{[]string{"-", "nosuch:/tmp/d"}, `no sandbox "nosuch"`},
		{[]string{f, "s:tmp/x"}, `the path in the sandbox, "tmp/x", must be absolute`},
		{[]string{"s:tmp/x", host}, `the path in the sandbox, "tmp/x", must be absolute`},
		{[]string{filepath.Join(host, "missing"), "s:/tmp/"}, "no such file or directory"},
		{[]string{"s:/tmp/x", filepath.Join(host, "missing") + "/"}, "is not a directory"},
		{[]string{"s:/tmp/x", f + "/"}, "is not a directory"},
	} {
		code, out, errOut := flmboxCLI(t, append([]string{"--root", root, "cp"}, tc.args...)...)
		if code != 125 || out != "" || !strings.HasPrefix(errOut, "flmbox: ") || !strings.Contains(errOut, tc.want) {
			t.Errorf("cp %q: exit %d, stdout %q, stderr %q; want 125 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	if ents, _ := os.ReadDir(host); len(ents) != 1 {
		t.Errorf("a refused cp wrote on the host: %v", ents)
	}
}
