//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

// writeWheelRequiring writes into dir a pure-Python wheel of project name
// (module name with '-' as '_', whose GREETING names it) that requires
// requires (Requires-Dist), and returns its path.
func writeWheelRequiring(t *testing.T, dir, name, version string, requires ...string) string {
	t.Helper()
	mod := strings.ReplaceAll(name, "-", "_")
	es := wheeltest.Entries(name, version, map[string]string{mod + "/__init__.py": "GREETING = 'hello from " + name + "'\n"})
	di := wheeltest.DistInfo(name, version)
	for i, e := range es {
		if e.Name == di+"/METADATA" {
			meta := wheeltest.Metadata(name, version)
			head, rest, _ := strings.Cut(meta, "\n\n")
			for _, r := range requires {
				head += "\nRequires-Dist: " + r
			}
			es[i].Body = []byte(head + "\n\n" + rest)
		}
	}
	p := filepath.Join(dir, wheeltest.Filename(name, version))
	if err := os.WriteFile(p, wheeltest.Zip(wheeltest.WithRecord(di, es)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPipSeesTheImage: pip install in a --network none sandbox installs a
// wheel from the cache whose requirement (pip) the image's own packages
// meet, without looking for that requirement (the cache has no pip wheel:
// with PIP_TARGET, pip ignored the image's packages and failed with "No
// matching distribution found for pip"); what it installs lands in the
// user site under HOME=/tmp, imports in the next calls (the agent's Python
// puts the user site on sys.path as python3 does) and goes with a reset;
// pip install --user does the same.
func TestPipSeesTheImage(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	dir := t.TempDir()
	mustFlmbox(t, root, "pipcache", "add",
		writeWheelRequiring(t, dir, "flmbox-needs-pip", "1.0", "pip>=20"),
		writeWheelRequiring(t, dir, "flmbox-for-user", "1.0"))
	mustFlmbox(t, root, "sandbox", "create", "--name", "pip", "--image", reg.digestRef())
	// The image has pip, in its dist-packages; the cache has none.
	imagePip, _ := filepath.Glob(filepath.Join(stateroot.Images(root), "rootfs", "*", "rootfs", "usr", "lib", "python3", "dist-packages", "pip-*.dist-info"))
	if len(imagePip) == 0 {
		t.Fatal("the test image has no pip in dist-packages: this test would prove nothing")
	}
	for _, w := range pipcacheList(t, root) {
		if w["name"] == "pip" {
			t.Fatalf("the wheel cache has a pip wheel: %v", w)
		}
	}

	const site = "/tmp/.local/lib/python3.11/site-packages"
	for round := 0; round < 2; round++ { // a new sandbox, then one reset
		res := flmbox(t, root, "run", "--sandbox", "pip", "-l", "shell", "-c", "pip install flmbox-needs-pip")
		if res.code != 0 || !strings.Contains(res.stdout, "Successfully installed flmbox-needs-pip-1.0\n") ||
			!strings.Contains(res.stdout, "Requirement already satisfied: pip>=20 in /usr/lib/python3/dist-packages") {
			t.Fatalf("round %d: pip install: exit %d stdout %q stderr %q", round, res.code, res.stdout, res.stderr)
		}
		res = flmbox(t, root, "run", "--sandbox", "pip", "-l", "shell", "-c", "pip install --user flmbox-for-user")
		if res.code != 0 || !strings.Contains(res.stdout, "Successfully installed flmbox-for-user-1.0\n") {
			t.Fatalf("round %d: pip install --user: exit %d stdout %q stderr %q", round, res.code, res.stdout, res.stderr)
		}
		for i := 0; i < 2; i++ { // a python3 spare, then the zygote's children
			out := mustFlmbox(t, root, "run", "--sandbox", "pip", "-c",
				"import flmbox_needs_pip, flmbox_for_user\nprint(flmbox_needs_pip.__file__)\nprint(flmbox_for_user.GREETING)")
			if out != site+"/flmbox_needs_pip/__init__.py\nhello from flmbox-for-user\n" {
				t.Fatalf("round %d, call %d: %q", round, i, out)
			}
		}
		if out := mustFlmbox(t, root, "run", "--sandbox", "pip", "-l", "shell", "-c", "pip list --user 2>/dev/null | grep flmbox | tr -s ' '"); out != "flmbox-for-user 1.0\nflmbox-needs-pip 1.0\n" {
			t.Fatalf("round %d: pip list --user printed %q", round, out)
		}
		if out := mustFlmbox(t, root, "run", "--sandbox", "pip", "--reset", "-l", "shell", "-c", "ls -A /tmp"); out != "" {
			t.Fatalf("round %d: /tmp after a reset: %q", round, out)
		}
	}
}
