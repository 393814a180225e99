//go:build integration

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCpHostileLinks: a snippet replaces paths under /tmp with links to
// /etc, to the agent's socket directory and to another directory; a copy
// into them writes nothing where they point (it fails, or replaces the link
// itself), and the sandbox goes on answering.
func TestCpHostileLinks(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	_, runDir, hostRunDir := faultAgentPaths(t, root, "s")
	host := t.TempDir()
	f := filepath.Join(host, "f")
	if err := os.WriteFile(f, []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(host, "dir")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "g"), []byte("g\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const etcListing = `ls -lA --time-style=+%s /etc | sha256sum; find /etc -newer /tmp/stamp 2>/dev/null | wc -l`
	shell(t, root, "s", fmt.Sprintf(`set -e; touch /tmp/stamp; mkdir /tmp/victim /tmp/deep
		ln -s /etc /tmp/x; ln -s %s /tmp/y; ln -s /tmp/victim /tmp/v; ln -s ../victim /tmp/deep/sub`, runDir))
	etcBefore := shell(t, root, "s", etcListing)
	runBefore := hostListing(t, hostRunDir)

	for _, tc := range []struct {
		src, dst   string
		mayReplace string // the link cp may replace with a copy of src, instead of failing
	}{
		{f, "s:/tmp/x/", ""},
		{f, "s:/tmp/x/f", ""},
		{f, "s:/tmp/x/sub/f", ""},
		{dir, "s:/tmp/x/", ""},
		{dir, "s:/tmp/x/sub/", ""},
		{dir, "s:/tmp/x/sub", ""},
		{f, "s:/tmp/y/", ""},
		{f, "s:/tmp/y/agent.sock", ""},
		{dir, "s:/tmp/y/", ""},
		{f, "s:/tmp/v/", ""},
		{f, "s:/tmp/v/f", ""},
		{dir, "s:/tmp/v/", ""},
		{dir, "s:/tmp/deep/sub/", ""},
		{dir, "s:/tmp/deep/sub/new", ""},
		{f, "s:/tmp/v", "/tmp/v"},
		{dir, "s:/tmp/deep/sub", "/tmp/deep/sub"},
	} {
		res := cp(t, root, nil, tc.src, tc.dst)
		switch {
		case res.code == 0 && tc.mayReplace != "":
			if out := shell(t, root, "s", "stat -c %F "+tc.mayReplace); out != "regular file\n" && out != "directory\n" {
				t.Errorf("cp %s %s succeeded, and %s is a %q, not what was copied", tc.src, tc.dst, tc.mayReplace, out)
			}
		case res.code != 125 || !strings.Contains(res.stderr, "symbolic link") && !strings.Contains(res.stderr, "not a directory"):
			t.Errorf("cp %s %s through a link: exit %d, stderr %q; want it refused (125)", tc.src, tc.dst, res.code, res.stderr)
		}
	}
	if out := shell(t, root, "s", "ls -A /tmp/victim | wc -l; test ! -e /etc/f && test ! -e /etc/dir && test ! -e /etc/sub && echo no-etc"); out != "0\nno-etc\n" {
		t.Errorf("a copy went through a link: %q", out)
	}
	if etcAfter := shell(t, root, "s", etcListing); etcAfter != etcBefore {
		t.Errorf("/etc changed: before %q, after %q", etcBefore, etcAfter)
	}
	if runAfter := hostListing(t, hostRunDir); runAfter != runBefore {
		t.Errorf("the agent's socket directory changed:\nbefore %s\nafter  %s", runBefore, runAfter)
	}
	if state := sandboxState(t, root, "s", "--probe"); state != "running" {
		t.Errorf("sandbox ls says %s, want running", state)
	}
	checkAlive(t, root, "s")
}

// hostListing lists the host directory p: names, modes and sizes.
func hostListing(t *testing.T, p string) string {
	t.Helper()
	ents, err := os.ReadDir(p)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range ents {
		fi, _ := e.Info()
		fmt.Fprintf(&b, "%s %v %d; ", e.Name(), fi.Mode(), fi.Size())
	}
	return b.String()
}

// TestCpStreamsThroughLinks: a tar stream on stdin whose entries go through
// a link (one the stream makes, or one a snippet planted) is refused, and
// nothing is written where the link points.
func TestCpStreamsThroughLinks(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	shell(t, root, "s", "mkdir /tmp/m /tmp/victim; ln -s /tmp/victim /tmp/m/planted; ln -s /etc /tmp/m/etc")
	for _, tc := range []struct {
		name   string
		stream []byte
	}{
		{"through its own link", tarOf(t, link("l", "/tmp/victim"), regular("l/evil", "x", 0o644))},
		{"through its own relative link", tarOf(t, link("l2", "../victim"), directory("l2/d/"))},
		{"through a link there before", tarOf(t, regular("planted/evil", "x", 0o644))},
		{"a dir entry on a link there before", tarOf(t, directory("planted/"), regular("planted/evil2", "x", 0o644))},
		{"into /etc through a link there before", tarOf(t, regular("etc/evil", "x", 0o644))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cpRefused(t, root, tc.stream, "symbolic link", "-", "s:/tmp/m/")
		})
	}
	if out := shell(t, root, "s", "ls -A /tmp/victim | wc -l; find /tmp /etc -name 'evil*' 2>/dev/null | wc -l"); out != "0\n0\n" {
		t.Errorf("a stream went through a link: %q, want /tmp/victim empty and no evil anywhere", out)
	}
}
