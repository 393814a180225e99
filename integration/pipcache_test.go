//go:build integration

package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

// pipcacheList returns `pipcache ls --json`.
func pipcacheList(t *testing.T, root string) []map[string]any {
	t.Helper()
	var ws []map[string]any
	if out := mustFlmbox(t, root, "pipcache", "ls", "--json"); json.Unmarshal([]byte(out), &ws) != nil {
		t.Fatalf("pipcache ls --json printed %q", out)
	}
	return ws
}

// cacheListing names and hashes every file under the wheel cache on the
// host: what sandboxes must never change.
func cacheListing(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(stateroot.Pipcache(root), func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == filepath.Join(stateroot.Pipcache(root), "lock") {
			return err
		}
		data, _ := os.ReadFile(p)
		sum := sha256.Sum256(data)
		b.WriteString(p + " " + fi.Mode().String() + " " + fi.ModTime().String() + " " + hex.EncodeToString(sum[:]) + "\n")
		return nil
	})
	return b.String()
}

// TestPipcacheOfflineInstall: a wheel added to the cache installs with pip
// in a --network none sandbox (whose Debian Python is "externally
// managed"), the next call imports it, a fresh sandbox does not have it, and
// what the cache lacks fails at once with pip's message. The cache is a
// read-only mount, and nothing a snippet tries changes it on the host.
func TestPipcacheOfflineInstall(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	// The test image's Python marks itself externally managed (PEP 668).
	marks, _ := filepath.Glob(filepath.Join(stateroot.Images(root), "rootfs", "*", "rootfs", "usr", "lib", "python3*", "EXTERNALLY-MANAGED"))
	if len(marks) == 0 {
		t.Fatal("the test image's Python is not marked externally managed: this test would prove nothing about PEP 668")
	}
	mustFlmbox(t, root, "pipcache", "add", writeTestWheel(t, t.TempDir(), "flmbox-offline", "1.0"))
	mustFlmbox(t, root, "sandbox", "create", "--name", "work", "--image", reg.digestRef())
	t.Run("read-only", func(t *testing.T) { pipcacheReadOnly(t, root, "work", wheeltest.Filename("flmbox-offline", "1.0")) })

	out := mustFlmbox(t, root, "run", "--sandbox", "work", "-l", "shell", "-c", "python3 -m pip install flmbox-offline")
	if !strings.Contains(out, "Successfully installed flmbox-offline-1.0") {
		t.Fatalf("pip install printed %q", out)
	}
	// This call's Python started before pip made the user site
	// (/tmp/.local/lib/python3.11/site-packages): the snippet's bootstrap
	// must look for it once the code has come, as python3 does at its
	// start.
	if out := mustFlmbox(t, root, "run", "--sandbox", "work", "-c", "import flmbox_offline; print(flmbox_offline.GREETING)"); out != "hello from flmbox-offline 1.0\n" {
		t.Fatalf("the next call printed %q", out)
	}
	// The same after Python calls have run (the agent then forks Python
	// from a zygote that started before the user site existed).
	mustFlmbox(t, root, "sandbox", "create", "--name", "warm", "--image", reg.digestRef())
	for range 3 {
		mustFlmbox(t, root, "run", "--sandbox", "warm", "-c", "import sys")
	}
	mustFlmbox(t, root, "run", "--sandbox", "warm", "-l", "shell", "-c", "python3 -m pip install --quiet flmbox-offline")
	for range 2 {
		if out := mustFlmbox(t, root, "run", "--sandbox", "warm", "-c", "import flmbox_offline; print(flmbox_offline.GREETING)"); out != "hello from flmbox-offline 1.0\n" {
			t.Fatalf("a warm sandbox's next call printed %q", out)
		}
	}
	if out := mustFlmbox(t, root, "run", "--sandbox", "work", "-l", "shell", "-c", "python3 -m pip cache dir; ls /tmp/.local/lib/python3.11/site-packages"); !strings.HasPrefix(out, "/tmp/.cache/pip\n") || !strings.Contains(out, "flmbox_offline\n") {
		t.Fatalf("pip's cache and the user site: %q", out)
	}
	res := flmbox(t, root, "run", "--image", reg.digestRef(), "-c", "import flmbox_offline")
	if res.code != 1 || !strings.Contains(res.stderr, "ModuleNotFoundError") {
		t.Fatalf("a fresh sandbox imported it: exit %d %q", res.code, res.stderr)
	}
	// pip fails from the cache alone: it never tries an index (which it
	// would retry, then fail to connect to, in a --network none sandbox).
	res = flmbox(t, root, "run", "--sandbox", "work", "-l", "shell", "-c", "python3 -m pip install flmbox-absent")
	if res.code == 0 || !strings.Contains(res.stderr, "No matching distribution found for flmbox-absent") ||
		strings.Contains(res.stdout+res.stderr, "Retrying") || strings.Contains(res.stdout+res.stderr, "NewConnectionError") {
		t.Fatalf("installing what the cache lacks: exit %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
}

// TestPipcacheIndexAndFetch: pip installs from a loopback PEP 503 index in
// a --network host sandbox; pipcache fetch fills the cache from it; a
// --network none sandbox then installs from the cache, without the index.
func TestPipcacheIndexAndFetch(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	fn, wheel := testWheel("flmbox-other", "2.0")
	ix := startIndex(t, map[string][]byte{fn: wheel})
	install := "python3 -m pip install %s flmbox-other && python3 -c 'import flmbox_other; print(flmbox_other.GREETING)'"

	out := mustFlmbox(t, root, "run", "--image", reg.digestRef(), "--network", "host", "-l", "shell", "-c",
		strings.Replace(install, "%s", "--index-url "+ix.simpleURL(), 1))
	if !strings.HasSuffix(out, "hello from flmbox-other 2.0\n") || ix.requests.Load() == 0 {
		t.Fatalf("install from the index: %q (%d requests)", out, ix.requests.Load())
	}
	if len(pipcacheList(t, root)) != 0 {
		t.Fatal("installing from the index filled the cache")
	}

	out = mustFlmbox(t, root, "pipcache", "fetch", "--image", reg.digestRef(), "--index-url", ix.simpleURL(), "flmbox-other==2.0")
	sum := sha256.Sum256(wheel)
	if out != fn+"\tsha256:"+hex.EncodeToString(sum[:])+"\tadded\n" {
		t.Fatalf("pipcache fetch printed %q", out)
	}
	ws := pipcacheList(t, root)
	if len(ws) != 1 || ws[0]["name"] != "flmbox-other" || ws[0]["version"] != "2.0" || ws[0]["digest"] != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("pipcache ls: %v", ws)
	}
	// fetch left no sandbox, no inbox and no mount.
	if ls := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(ls) != "[]" {
		t.Errorf("sandboxes left by fetch: %s", ls)
	}
	if left, _ := os.ReadDir(filepath.Join(stateroot.Pipcache(root), "tmp")); len(left) != 0 {
		t.Errorf("fetch left %v in the cache's tmp/", left)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), stateroot.Pipcache(root)) {
		t.Errorf("fetch left a mount under the cache")
	}

	served := ix.requests.Load()
	out = mustFlmbox(t, root, "run", "--image", reg.digestRef(), "-l", "shell", "-c", strings.Replace(install, "%s", "", 1))
	if !strings.HasSuffix(out, "hello from flmbox-other 2.0\n") || ix.requests.Load() != served {
		t.Fatalf("install from the cache: %q (%d index requests)", out, ix.requests.Load()-served)
	}

	// What the index does not have fails the fetch, which imports nothing.
	res := flmbox(t, root, "pipcache", "fetch", "--image", reg.digestRef(), "--index-url", ix.simpleURL(), "flmbox-absent")
	if res.code != 125 || !strings.Contains(res.stderr, "No matching distribution found for flmbox-absent") {
		t.Fatalf("fetch of a missing project: exit %d %q", res.code, res.stderr)
	}
}

// TestPipcacheFetchRefusesBadWheels: what pip download brings goes through
// add's validation; a bad wheel on the index is refused and nothing of the
// download (here a good wheel beside it) is imported.
func TestPipcacheFetchRefusesBadWheels(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	goodName, good := testWheel("flmbox-dep", "1.0")
	// A wheel that pip download takes as it is, with an entry that climbs
	// out of the directory it is unpacked into.
	di := wheeltest.DistInfo("flmbox-liar", "1.0")
	evil := wheeltest.Zip(wheeltest.WithRecord(di, append(wheeltest.Entries("flmbox-liar", "1.0", nil),
		wheeltest.Entry{Name: "../../../tmp/evil.pth", Body: []byte("import os\n")})))
	ix := startIndex(t, map[string][]byte{goodName: good, wheeltest.Filename("flmbox-liar", "1.0"): evil})
	res := flmbox(t, root, "pipcache", "fetch", "--image", reg.digestRef(), "--index-url", ix.simpleURL(), "flmbox-dep", "flmbox-liar")
	if res.code != 125 || !strings.Contains(res.stderr, "path traversal") || !strings.Contains(res.stderr, "nothing was imported") {
		t.Fatalf("fetch with a bad wheel: exit %d %q %q", res.code, res.stdout, res.stderr)
	}
	if ws := pipcacheList(t, root); len(ws) != 0 {
		t.Fatalf("a refused fetch imported %v", ws)
	}
}

// TestPipcacheCreateWithPip: --pip preinstalls from the cache at creation;
// a requirement the cache cannot satisfy fails the creation with pip's
// message and leaves no sandbox and no lease.
func TestPipcacheCreateWithPip(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	mustFlmbox(t, root, "pipcache", "add", writeTestWheel(t, t.TempDir(), "flmbox-pre", "1.0"))
	mustFlmbox(t, root, "sandbox", "create", "--name", "pre", "--image", reg.digestRef(), "--pip", "flmbox-pre>=1,<2")
	if out := mustFlmbox(t, root, "run", "--sandbox", "pre", "-c", "import flmbox_pre; print(flmbox_pre.GREETING)"); out != "hello from flmbox-pre 1.0\n" {
		t.Fatalf("after --pip: %q", out)
	}
	res := flmbox(t, root, "sandbox", "create", "--name", "bad", "--image", reg.digestRef(), "--pip", "flmbox-pre", "--pip", "flmbox-absent")
	if res.code != 125 || !strings.Contains(res.stderr, "No matching distribution found for flmbox-absent") || !strings.Contains(res.stderr, "pipcache add") {
		t.Fatalf("--pip of a missing wheel: exit %d %q", res.code, res.stderr)
	}
	if sbs := sandboxLs(t, root); len(sbs) != 1 || sbs[0].Name != "pre" {
		t.Fatalf("sandboxes after a failed --pip: %+v", sbs)
	}
	var imgs []struct{ Holders []string }
	json.Unmarshal([]byte(mustFlmbox(t, root, "images", "ls", "--json")), &imgs)
	if len(imgs) != 1 || len(imgs[0].Holders) != 1 || !strings.HasPrefix(imgs[0].Holders[0], "pre.flmbox-") { // NAME.CONTAINER-ID
		t.Fatalf("leases after a failed --pip: %v", imgs)
	}
	if out := mustFlmbox(t, root, "run", "--image", reg.digestRef(), "--pip", "flmbox-pre", "-c", "import flmbox_pre; print(flmbox_pre.GREETING)"); out != "hello from flmbox-pre 1.0\n" {
		t.Fatalf("run --image --pip: %q", out)
	}
}

// TestPipcacheAddRefusesBadWheels: add refuses a bad file with a clear
// message and imports nothing of its batch.
func TestPipcacheAddRefusesBadWheels(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	good := writeTestWheel(t, t.TempDir(), "flmbox-good", "1.0")
	write := func(name string, b []byte) string {
		p := filepath.Join(t.TempDir(), name)
		os.WriteFile(p, b, 0o600)
		return p
	}
	_, hello := testWheel("flmbox-hello", "1.0")
	di := wheeltest.DistInfo("flmbox-hello", "1.0")
	entries := wheeltest.Entries("flmbox-hello", "1.0", map[string]string{"flmbox_hello/__init__.py": "X = 1\n"})
	withEntry := func(e wheeltest.Entry) []byte {
		return wheeltest.Zip(wheeltest.WithRecord(di, append(append([]wheeltest.Entry{}, entries...), e)))
	}
	mismatch := wheeltest.Zip(wheeltest.WithRecord(di, append(append([]wheeltest.Entry{}, entries[:1]...),
		wheeltest.Entry{Name: di + "/METADATA", Body: []byte(wheeltest.Metadata("flmbox-evil", "1.0"))},
		entries[2])))
	for name, tc := range map[string]struct {
		path, err string
	}{
		"wrong name":        {write("flmbox_other-1.0-py3-none-any.whl", hello), "does not match the filename"},
		"not a wheel name":  {write("flmbox-hello.zip", hello), "does not end in .whl"},
		"not a zip":         {write("flmbox_hello-1.0-py3-none-any.whl", []byte("print('not a zip')\n")), "not a readable zip"},
		"METADATA mismatch": {write("flmbox_hello-1.0-py3-none-any.whl", mismatch), `METADATA names the project "flmbox-evil"`},
		"traversal":         {write("flmbox_hello-1.0-py3-none-any.whl", withEntry(wheeltest.Entry{Name: "../../../etc/cron.d/evil", Body: []byte("x")})), "path traversal"},
		"absolute name":     {write("flmbox_hello-1.0-py3-none-any.whl", withEntry(wheeltest.Entry{Name: "/etc/evil", Body: []byte("x")})), "absolute name"},
	} {
		res := flmbox(t, root, "pipcache", "add", good, tc.path)
		if res.code != 125 || !strings.Contains(res.stderr, tc.err) || !strings.Contains(res.stderr, "nothing was imported") {
			t.Errorf("%s: exit %d %q", name, res.code, res.stderr)
		}
	}
	if ws := pipcacheList(t, root); len(ws) != 0 {
		t.Fatalf("refused batches imported %v", ws)
	}
	if left, _ := os.ReadDir(filepath.Join(stateroot.Pipcache(root), "tmp")); len(left) != 0 {
		t.Fatalf("refused imports left %v", left)
	}
}

// pipcacheReadOnly checks that the cache, holding wheel, is mounted
// read-only in sandbox name, and that nothing a snippet tries changes it
// on the host.
func pipcacheReadOnly(t *testing.T, root, name, wheel string) {
	before := cacheListing(t, root)
	out := mustFlmbox(t, root, "run", "--sandbox", name, "-l", "shell", "-c", `
grep ' /dev/.flmbox/wheels ' /proc/self/mountinfo
w=/dev/.flmbox/wheels
f=$w/`+wheel+`
for try in "touch $w/new.whl" "rm -f $f" "mv $f $w/x.whl" "ln $f $w/l.whl" "chmod 777 $f" "truncate -s 0 $f" "mkdir $w/d" "sh -c 'echo x >> $f'"; do
	if sh -c "$try" 2>/dev/null; then echo "WROTE: $try"; fi
done
python3 - <<'PY'
import os
for path, flags in (("/dev/.flmbox/wheels/`+wheel+`", os.O_WRONLY), ("/dev/.flmbox/wheels/py.whl", os.O_WRONLY | os.O_CREAT)):
    try:
        os.open(path, flags)
        print("WROTE:", path)
    except OSError as e:
        print("refused:", e.strerror)
PY
`)
	if strings.Contains(out, "WROTE") {
		t.Errorf("a snippet wrote the cache:\n%s", out)
	}
	mount, _, _ := strings.Cut(out, "\n")
	if fields := strings.Fields(mount); len(fields) < 6 || !strings.HasPrefix(fields[5], "ro") {
		t.Errorf("the cache is not mounted read-only: %q", mount)
	}
	if after := cacheListing(t, root); after != before {
		t.Errorf("the cache changed on the host:\nbefore\n%s\nafter\n%s", before, after)
	}
}
