package app

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/flmbox/flmbox/pipcache/wheeltest"
	"github.com/flmbox/flmbox/sandbox"
)

// flmboxCLI runs the CLI in-process and returns its exit code and output.
func flmboxCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(t.Context(), append([]string{"flmbox"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestPipcacheAddLsRm(t *testing.T) {
	root, src := t.TempDir(), t.TempDir()
	good := filepath.Join(src, wheeltest.Filename("hello", "1.0"))
	os.WriteFile(good, wheeltest.Build("hello", "1.0", map[string]string{"hello.py": "X = 1\n"}), 0o600)
	bad := filepath.Join(src, wheeltest.Filename("other", "1.0"))
	os.WriteFile(bad, wheeltest.Build("evil", "1.0", nil), 0o600)

	code, out, errOut := flmboxCLI(t, "--root", root, "pipcache", "add", good, bad)
	if code != 125 || out != "" || !strings.Contains(errOut, "does not match the filename") || !strings.Contains(errOut, "nothing was imported") {
		t.Fatalf("add with a bad wheel: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = flmboxCLI(t, "--root", root, "pipcache", "add", good)
	if code != 0 || !strings.HasPrefix(out, "hello-1.0-py3-none-any.whl\tsha256:") || !strings.HasSuffix(out, "\tadded\n") {
		t.Fatalf("add: exit %d %q %q", code, out, errOut)
	}
	if _, out, _ = flmboxCLI(t, "--root", root, "pipcache", "add", good); !strings.HasSuffix(out, "\talready cached\n") {
		t.Fatalf("second add: %q", out)
	}
	_, out, _ = flmboxCLI(t, "--root", root, "pipcache", "ls", "--json")
	var ls []map[string]any
	if err := json.Unmarshal([]byte(out), &ls); err != nil || len(ls) != 1 || ls[0]["name"] != "hello" || ls[0]["version"] != "1.0" {
		t.Fatalf("ls --json: %q %v", out, err)
	}
	if _, out, _ = flmboxCLI(t, "--root", root, "pipcache", "ls"); !strings.Contains(out, "hello-1.0-py3-none-any.whl") {
		t.Fatalf("ls: %q", out)
	}
	code, out, errOut = flmboxCLI(t, "--root", root, "pipcache", "rm", "Hello==1.0.0", "absent")
	if code != 0 || out != "removed hello-1.0-py3-none-any.whl\n" || !strings.Contains(errOut, "no cached wheel matches absent") {
		t.Fatalf("rm: exit %d %q %q", code, out, errOut)
	}
	if _, out, _ = flmboxCLI(t, "--root", root, "pipcache", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls after rm: %q", out)
	}
	if code, _, errOut = flmboxCLI(t, "--root", root, "pipcache", "rm", "x>=1"); code != 125 || !strings.Contains(errOut, "NAME==VERSION") {
		t.Fatalf("rm x>=1: exit %d %q", code, errOut)
	}
}

func TestPipFlag(t *testing.T) {
	parse := func(args ...string) (sandbox.Spec, error) {
		var o sandbox.Spec
		var err error
		app := &cli.App{Flags: append(sandboxFlags(), &cli.StringFlag{Name: "batch"}), Writer: &bytes.Buffer{}, ErrWriter: &bytes.Buffer{},
			Action: func(c *cli.Context) error { o, err = specFrom(c); return nil }}
		if rerr := app.Run(append([]string{"flmbox"}, args...)); rerr != nil {
			t.Fatal(rerr)
		}
		return o, err
	}
	o, err := parse("--pip", "pandas>=2,<3", "--pip", "numpy")
	if err != nil || !slices.Equal(o.Pip, []string{"pandas>=2,<3", "numpy"}) {
		t.Fatalf("--pip: %q %v", o.Pip, err)
	}
	if _, err := parse("--batch", "b.json", "--pip", "numpy"); err == nil || !strings.Contains(err.Error(), "--batch") {
		t.Errorf("--pip with --batch: %v", err)
	}
	for _, bad := range []string{"--index-url=http://evil", "", "a\nb"} {
		if _, err := parse("--pip", bad); err == nil || !strings.Contains(err.Error(), "want a pip requirement") {
			t.Errorf("--pip %q: %v", bad, err)
		}
	}
}
