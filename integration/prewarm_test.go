//go:build integration

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/internal/testrig/testimage"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	"github.com/flmbox/flmbox/rootfs"
)

// prewarmJSON runs `flmbox prewarm --json` and decodes its single object,
// checking it has exactly the documented keys.
func prewarmJSON(t *testing.T, root string, args ...string) rootfs.Result {
	t.Helper()
	out := mustFlmbox(t, root, append([]string{"prewarm", "--json"}, args...)...)
	var keys map[string]any
	if err := json.Unmarshal([]byte(out), &keys); err != nil {
		t.Fatalf("prewarm --json printed %q: %v", out, err)
	}
	var got []string
	for k := range keys {
		got = append(got, k)
	}
	sort.Strings(got)
	if want := "cached index_digest manifest_digest platform rootfs size_bytes"; strings.Join(got, " ") != want {
		t.Fatalf("prewarm --json keys %v, want %s", got, want)
	}
	var res rootfs.Result
	json.Unmarshal([]byte(out), &res)
	return res
}

func TestPrewarmFromRegistryIsExactAndCached(t *testing.T) {
	t.Parallel()
	reg := ownRegistry(t)
	root := t.TempDir()
	res := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())
	if res.Cached || res.IndexDigest != img.IndexDigest.String() || res.ManifestDigest != img.AMD64Digest.String() ||
		res.Platform != "linux/amd64" || res.SizeBytes < 100<<20 {
		t.Fatalf("unexpected prewarm result %+v", res)
	}
	compareTrees(t, img.RootfsDir, res.Rootfs)
	checkFixtures(t, res.Rootfs)

	// The tree is a working Python root.
	out, err := exec.Command("chroot", res.Rootfs, "python3", "-c", "import json, sys; print(json.dumps(sys.version_info[:2]))").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "[3, ") {
		t.Fatalf("python3 in the unpacked tree: %s %v", out, err)
	}

	// Nothing in the state root is world-writable, and the tree (which holds
	// the image's own 1777 /tmp) is not reachable by other host users.
	entry := filepath.Dir(res.Rootfs)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == res.Rootfs {
			return fs.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Type() != fs.ModeSymlink && fi.Mode().Perm()&0o002 != 0 {
			t.Errorf("%s is world-writable", p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk the state root for world-writable files: %v", err)
	}
	if fi, err := os.Stat(entry); err != nil {
		t.Errorf("entry directory: %v", err)
	} else if fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("entry directory %s has mode %v; want no access for others", entry, fi.Mode())
	}

	// Second prewarm by index digest: cached, and not one registry request.
	before := reg.requests.Load()
	again := prewarmJSON(t, root, reg.digestRef())
	if !again.Cached || again.Rootfs != res.Rootfs {
		t.Fatalf("second prewarm %+v", again)
	}
	if n := reg.requests.Load() - before; n != 0 {
		t.Fatalf("a cache hit by index digest made %d registry requests", n)
	}
}

// compareTrees checks that every entry of the debootstrap tree src is in
// the unpacked tree dst with the same type, mode, owner, size, content,
// symlink target and mtime, that hardlinks are preserved, and that dst holds
// nothing else but the test image's fixtures and the paths that its entry's
// image.json records as added for mount points.
func compareTrees(t *testing.T, src, dst string) {
	t.Helper()
	var entry rootfs.Image
	b, err := os.ReadFile(filepath.Join(filepath.Dir(dst), "image.json"))
	if err != nil || json.Unmarshal(b, &entry) != nil {
		t.Fatalf("read the image.json of %s: %v", dst, err)
	}
	added := map[string]bool{}
	for _, p := range entry.Added {
		added[strings.TrimPrefix(p, "/")] = true
	}
	seen := map[string]bool{}
	inodes := map[uint64]string{} // src inode -> first path
	var mismatches []string
	bad := func(format string, args ...any) {
		if len(mismatches) < 20 {
			mismatches = append(mismatches, fmt.Sprintf(format, args...))
		}
	}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		seen[rel] = true
		a, _ := os.Lstat(p)
		b, err := os.Lstat(filepath.Join(dst, rel))
		if err != nil {
			bad("%s: missing: %v", rel, err)
			return nil
		}
		as, bs := a.Sys().(*syscall.Stat_t), b.Sys().(*syscall.Stat_t)
		if a.Mode() != b.Mode() {
			bad("%s: mode %v, want %v", rel, b.Mode(), a.Mode())
		}
		if as.Uid != bs.Uid || as.Gid != bs.Gid {
			bad("%s: owner %d:%d, want %d:%d", rel, bs.Uid, bs.Gid, as.Uid, as.Gid)
		}
		if !a.IsDir() && a.ModTime().Unix() != b.ModTime().Unix() {
			bad("%s: mtime %v, want %v", rel, b.ModTime(), a.ModTime())
		}
		switch {
		case a.Mode().IsRegular():
			if a.Size() != b.Size() || fileHash(p) != fileHash(filepath.Join(dst, rel)) {
				bad("%s: content differs", rel)
			}
			if first, ok := inodes[as.Ino]; ok {
				fb, _ := os.Lstat(filepath.Join(dst, first))
				if fb == nil || fb.Sys().(*syscall.Stat_t).Ino != bs.Ino {
					bad("%s: not a hardlink of %s", rel, first)
				}
			} else if as.Nlink > 1 {
				inodes[as.Ino] = rel
			}
		case a.Mode()&fs.ModeSymlink != 0:
			at, _ := os.Readlink(p)
			bt, _ := os.Readlink(filepath.Join(dst, rel))
			if at != bt {
				bad("%s: symlink to %q, want %q", rel, bt, at)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(dst, p)
		if !seen[rel] && !added[rel] && !strings.HasPrefix(rel, "etc/flmbox-test") && !strings.HasPrefix(rel, "opt/flmbox-test") {
			bad("%s: not in the image", rel)
		}
		return nil
	})
	if len(mismatches) > 0 {
		t.Fatalf("unpacked tree differs from the image:\n%s", strings.Join(mismatches, "\n"))
	}
}

// checkFixtures checks the whiteouts and special entries of the test image.
func checkFixtures(t *testing.T, root string) {
	t.Helper()
	for _, gone := range []string{testimage.RemovedFile, testimage.OpaqueOld, testimage.OpaqueDeep, filepath.Dir(testimage.OpaqueDeep)} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("%s should have been whited out: %v", gone, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, testimage.OpaqueNew)); err != nil || string(b) != testimage.OpaqueNewContent {
		t.Errorf("%s: %q %v", testimage.OpaqueNew, b, err)
	}
	if fi, err := os.Lstat(filepath.Join(root, testimage.SetuidFile)); err != nil || fi.Mode() != testimage.SetuidMode {
		t.Errorf("%s: mode %v, want %v (%v)", testimage.SetuidFile, modeOf(fi), testimage.SetuidMode, err)
	}
	if fi, err := os.Lstat(filepath.Join(root, testimage.StickyDir)); err != nil || fi.Mode().Perm()|fi.Mode()&os.ModeSticky != testimage.StickyMode {
		t.Errorf("%s: mode %v, want %v (%v)", testimage.StickyDir, modeOf(fi), testimage.StickyMode, err)
	}
	a, _ := os.Lstat(filepath.Join(root, testimage.HardlinkFirst))
	b, _ := os.Lstat(filepath.Join(root, testimage.HardlinkSecond))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Errorf("%s and %s are not one inode", testimage.HardlinkFirst, testimage.HardlinkSecond)
	}
	if target, err := os.Readlink(filepath.Join(root, testimage.Symlink)); err != nil || target != testimage.SymlinkTarget {
		t.Errorf("%s -> %q (%v), want %q", testimage.Symlink, target, err, testimage.SymlinkTarget)
	}
}

func modeOf(fi os.FileInfo) any {
	if fi == nil {
		return nil
	}
	return fi.Mode()
}

func fileHash(p string) [32]byte {
	f, err := os.Open(p)
	if err != nil {
		return [32]byte{}
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

func TestPrewarmRegistryDownAfterPrewarm(t *testing.T) {
	t.Parallel()
	reg := ownRegistry(t)
	root := t.TempDir()
	first := prewarmJSON(t, root, reg.digestRef())
	tagged := prewarmJSON(t, root, reg.tagRef())
	if !tagged.Cached || tagged.ManifestDigest != first.ManifestDigest {
		t.Fatalf("tag after digest: %+v", tagged)
	}
	reg.srv.Close()
	// By index digest: straight from the cache.
	if res := prewarmJSON(t, root, reg.digestRef()); !res.Cached || res.Rootfs != first.Rootfs {
		t.Fatalf("registry down, by digest: %+v", res)
	}
	// A cached tag needs no registry (--pull missing, the default; --debug
	// says why); --pull always tries it, then falls back, warning in one
	// line; --pull never and --offline never try.
	if res := flmbox(t, root, "--debug", "prewarm", reg.tagRef()); res.code != 0 || !strings.Contains(res.stderr, "the registry was not asked") {
		t.Fatalf("tag with the registry down: exit %d, %s", res.code, res.stderr)
	}
	if res := flmbox(t, root, "prewarm", "--pull", "always", reg.tagRef()); res.code != 0 ||
		!strings.HasPrefix(res.stderr, "flmbox: warning: the registry of "+reg.tagRef()+" could not be reached") || strings.Count(res.stderr, "\n") != 1 {
		t.Fatalf("--pull always, the registry down: exit %d, %q", res.code, res.stderr)
	}
	for _, flag := range []string{"--offline", "--pull=never"} {
		if res := prewarmJSON(t, root, flag, reg.tagRef()); !res.Cached || res.Rootfs != first.Rootfs {
			t.Fatalf("%s tag: %+v", flag, res)
		}
	}
	if res := flmbox(t, root, "prewarm", "--offline", "--pull", "always", reg.tagRef()); res.code != 125 || !strings.Contains(res.stderr, "--offline is --pull never") {
		t.Fatalf("--offline --pull always: exit %d, %s", res.code, res.stderr)
	}
	// A platform never prewarmed is an error offline, with what to do.
	res := flmbox(t, root, "prewarm", "--offline", "--platform", "linux/arm64", reg.digestRef())
	if res.code != 125 || !strings.Contains(res.stderr, "not cached") {
		t.Fatalf("offline miss: exit %d, %s", res.code, res.stderr)
	}
}

func TestPrewarmArm64AndLayout(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	arm := prewarmJSON(t, root, "--platform", "linux/arm64/v8", reg.digestRef())
	if arm.ManifestDigest != img.ARM64Digest.String() || arm.Platform != "linux/arm64" {
		t.Fatalf("arm64: %+v", arm)
	}
	if b, err := os.ReadFile(filepath.Join(arm.Rootfs, testimage.PlaceholderFile)); err != nil || string(b) != testimage.PlaceholderContent {
		t.Fatalf("arm64 placeholder: %q %v", b, err)
	}
	// An air-gapped worker: the same index from the OCI layout on disk.
	for _, ref := range []string{"oci-layout:" + img.LayoutPath + "@" + img.IndexDigest.String(), "oci-layout:" + img.LayoutPath} {
		res := prewarmJSON(t, root, "--platform", "linux/amd64", ref)
		if res.IndexDigest != img.IndexDigest.String() || res.ManifestDigest != img.AMD64Digest.String() {
			t.Fatalf("%s: %+v", ref, res)
		}
	}
	out := mustFlmbox(t, root, "images", "ls", "--json")
	var imgs []rootfs.Image
	if err := json.Unmarshal([]byte(out), &imgs); err != nil || len(imgs) != 2 {
		t.Fatalf("images ls --json: %s %v", out, err)
	}
	if res := flmbox(t, root, "prewarm", "--platform", "linux/s390x", reg.digestRef()); res.code != 125 || !strings.Contains(res.stderr, "linux/amd64, linux/arm64") {
		t.Fatalf("missing platform: exit %d %s", res.code, res.stderr)
	}
}

func TestPrewarmCorruptLayerLeavesNothing(t *testing.T) {
	t.Parallel()
	reg := ownRegistry(t)
	m, _ := img.Index.Image(img.AMD64Digest)
	layers, _ := m.Layers()
	d, _ := layers[0].Digest()
	reg.corrupt[d.String()] = true
	root := t.TempDir()
	res := flmbox(t, root, "prewarm", "--platform", "linux/amd64", reg.digestRef())
	if res.code != 125 || !strings.Contains(res.stderr, "layer 1 ("+d.String()+")") || !strings.Contains(res.stderr, "expected "+d.String()) {
		t.Fatalf("corrupt layer: exit %d, stderr %s", res.code, res.stderr)
	}
	assertNoEntries(t, root)
	// The registry heals; the next prewarm works.
	reg.mu.Lock()
	delete(reg.corrupt, d.String())
	reg.mu.Unlock()
	if r := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef()); r.Cached {
		t.Fatalf("after a failed pull: %+v", r)
	}
}

// readDirOrEmpty lists dir; a directory that does not exist is empty, any
// other error fails the test.
func readDirOrEmpty(t *testing.T, dir string) []fs.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("list %s: %v", dir, err)
	}
	return ents
}

// assertNoEntries fails if the cache holds an entry, a staging directory or
// an alias.
func assertNoEntries(t *testing.T, root string) {
	t.Helper()
	for _, d := range []string{"rootfs", "tmp", "trash"} {
		if ents := readDirOrEmpty(t, filepath.Join(stateroot.Images(root), d)); len(ents) != 0 {
			t.Errorf("images/%s is not empty: %v", d, ents)
		}
	}
	err := filepath.WalkDir(filepath.Join(stateroot.Images(root), "aliases"), func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == filepath.Join(stateroot.Images(root), "aliases") {
			return nil
		}
		if err != nil {
			return err
		}
		if !d.IsDir() {
			t.Errorf("alias %s is left", p)
		}
		return nil
	})
	if err != nil {
		t.Errorf("images/aliases: %v", err)
	}
}

func TestEightConcurrentPrewarmsDownloadOnce(t *testing.T) {
	t.Parallel()
	reg := ownRegistry(t)
	root := t.TempDir()
	const n = 8
	var wg sync.WaitGroup
	results := make([]result, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = flmbox(t, root, "prewarm", "--json", "--platform", "linux/amd64", reg.digestRef())
		}()
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("prewarm %d: exit %d: %s", i, r.code, r.stderr)
		}
		var res rootfs.Result
		json.Unmarshal([]byte(r.stdout), &res)
		if !res.Cached {
			fresh++
		}
	}
	m, _ := img.Index.Image(img.AMD64Digest)
	layers, _ := m.Layers()
	if got, want := reg.blobGets.Load(), int64(len(layers)+1); fresh != 1 || got != want {
		t.Fatalf("%d processes pulled and %d blobs were fetched; want 1 and %d (layers and config once)", fresh, got, want)
	}
}

func TestPrewarmKilledAnyMomentRecovers(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := t.TempDir()
	for _, delay := range []time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond, 200 * time.Millisecond,
		400 * time.Millisecond, 700 * time.Millisecond, 1000 * time.Millisecond, 1500 * time.Millisecond} {
		cmd := exec.Command(flmboxBin, "--root", root, "prewarm", "--platform", "linux/amd64", reg.digestRef())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay)
		cmd.Process.Kill()
		cmd.Wait()
		// Whatever is published is complete.
		for _, e := range readDirOrEmpty(t, filepath.Join(stateroot.Images(root), "rootfs")) {
			dir := filepath.Join(stateroot.Images(root), "rootfs", e.Name())
			if _, err := os.Stat(filepath.Join(dir, "image.json")); err != nil {
				t.Fatalf("killed after %v: published entry %s has no image.json", delay, e.Name())
			}
			if _, err := os.Stat(filepath.Join(dir, "rootfs", "usr", "bin", "python3")); err != nil {
				t.Fatalf("killed after %v: published entry %s is incomplete: %v", delay, e.Name(), err)
			}
			t.Logf("killed after %v: the pull had already finished", delay)
			os.RemoveAll(stateroot.Images(root))
		}
	}
	res := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())
	if res.Cached {
		t.Fatalf("after kills: %+v", res)
	}
	compareTrees(t, img.RootfsDir, res.Rootfs)
	if ents := readDirOrEmpty(t, filepath.Join(stateroot.Images(root), "tmp")); len(ents) != 0 {
		t.Fatalf("leftovers of killed pulls remain: %v", ents)
	}
}

func TestImagesLsRmGCWithLease(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := removableSandboxRoot(t, reg)
	res := prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())
	ls := mustFlmbox(t, root, "images", "ls")
	if !strings.Contains(ls, res.ManifestDigest[7:19]) || !strings.Contains(ls, img.IndexDigest.String()) {
		t.Fatalf("images ls:\n%s", ls)
	}
	// A sandbox leases the image it runs.
	mustFlmbox(t, root, "sandbox", "create", "--name", "sandbox-1", "--image", reg.digestRef())
	if r := flmbox(t, root, "images", "rm", img.IndexDigest.String()); r.code != 125 || !strings.Contains(r.stderr, "sandbox-1") {
		t.Fatalf("rm of an image in use: exit %d %s", r.code, r.stderr)
	}
	// Its budget missed, gc says so and fails, as sandbox gc does.
	if r := flmbox(t, root, "images", "gc", "--max-bytes", "0"); strings.Contains(r.stdout, "Deleted") || r.code != 125 ||
		!strings.Contains(r.stderr, "in use by sandboxes") {
		t.Fatalf("gc --max-bytes 0 with an image in use: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(res.Rootfs, "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
	mustFlmbox(t, root, "sandbox", "rm", "sandbox-1")
	// A lease whose sandbox does not exist (a killed flmbox's) keeps nothing:
	// images rm reconciles leases with sandboxes first.
	store, err := rootfs.OpenStore(stateroot.Images(root))
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox's lease is held by NAME.ID (sandbox.leaseHolder); another
	// holder is not a sandbox's, and reconciling leaves it.
	if err := store.Lease(context.Background(), res.ManifestDigest, "ghost.flmbox-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	if out := mustFlmbox(t, root, "images", "rm", reg.tagRef(), img.IndexDigest.String()); !strings.Contains(out, "Deleted: "+res.ManifestDigest) {
		t.Fatalf("rm:\n%s", out)
	}
	mustFlmbox(t, root, "images", "rm", img.IndexDigest.String()) // idempotent
	if out := mustFlmbox(t, root, "images", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("images ls after rm: %s", out)
	}
	assertNoEntries(t, root)

	// gc by age and by size.
	prewarmJSON(t, root, "--platform", "linux/amd64", reg.digestRef())
	if out := mustFlmbox(t, root, "images", "gc", "--unused-for", "1h"); strings.Contains(out, "Deleted") {
		t.Fatalf("gc removed a fresh image:\n%s", out)
	}
	if out := mustFlmbox(t, root, "images", "gc", "--max-bytes", "1MiB"); !strings.Contains(out, "Deleted: "+res.ManifestDigest) {
		t.Fatalf("gc --max-bytes:\n%s", out)
	}
	assertNoEntries(t, root)
}

func TestDoctor(t *testing.T) {
	t.Parallel()
	out := mustFlmbox(t, t.TempDir(), "doctor", "--json")
	var checks []struct {
		Name   string
		OK     bool
		Warn   bool
		Detail string
		Limits []struct {
			Name  string
			Value int64
			Low   bool
		}
	}
	if err := json.Unmarshal([]byte(out), &checks); err != nil {
		t.Fatalf("doctor --json: %s %v", out, err)
	}
	// The host's limits on how many sandboxes run: pid_max as /proc says,
	// and a fix printed for each that caps the count.
	var pidMax int64 = -1
	var low []string
	for _, c := range checks {
		if !c.OK {
			t.Errorf("doctor: %s: %s", c.Name, c.Detail)
		}
		if c.Name == "runsc" && !strings.Contains(c.Detail, runscPath) {
			t.Errorf("doctor runsc: %s", c.Detail)
		}
		for _, l := range c.Limits {
			if l.Name == "kernel.pid_max" {
				pidMax = l.Value
			}
			if l.Low {
				low = append(low, l.Name)
			}
		}
		if c.Name == "limits" && c.Warn != (len(low) > 0) {
			t.Errorf("doctor limits: warn %v with low limits %v", c.Warn, low)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err != nil || strings.TrimSpace(string(b)) != strconv.FormatInt(pidMax, 10) {
		t.Errorf("doctor's kernel.pid_max is %d; /proc says %q (%v)", pidMax, b, err)
	}
	text := mustFlmbox(t, t.TempDir(), "doctor")
	for _, name := range low {
		if name != "RLIMIT_NOFILE" && name != "MemAvailable" && name != "memory cgroups" && !strings.Contains(text, "fix: sysctl -w "+name+"=") {
			t.Errorf("doctor says %s is low but gives no sysctl fix:\n%s", name, text)
		}
	}
	t.Logf("low limits here: %v", low)
	res := flmbox(t, t.TempDir(), "--runsc", "/nonexistent/runsc", "doctor")
	if res.code != 1 || !strings.Contains(res.stdout, "fix: ") {
		t.Fatalf("doctor with a missing runsc: exit %d\n%s", res.code, res.stdout)
	}
}

// TestMissingAgent installs flmbox and flmbox-core without flmbox-agent:
// doctor names what is missing, and a new sandbox fails at once (exit 125,
// the same message) with nothing pulled, created or left behind.
func TestMissingAgent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, bin := range []string{flmboxBin, flmboxCore} {
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		testprog.Write(t, filepath.Join(dir, filepath.Base(bin)), data)
	}
	reg := startRegistry(t)
	root := t.TempDir()
	run := func(args ...string) result { return runFlmbox(t, filepath.Join(dir, "flmbox"), root, args...) }
	want := "find flmbox-agent, the sandboxes' agent, next to " + filepath.Join(dir, "flmbox-core")
	if res := run("doctor"); res.code != 1 || !strings.Contains(res.stdout, "FAIL  agent") || !strings.Contains(res.stdout, want) {
		t.Errorf("doctor without flmbox-agent: exit %d\n%s", res.code, res.stdout)
	}
	for _, args := range [][]string{
		{"sandbox", "create", "--name", "noagent", "--image", reg.digestRef()},
		{"run", "--image", reg.digestRef(), "-c", "print(1)"},
	} {
		res := run(args...)
		if res.code != 125 || !strings.Contains(res.stderr, want) || !strings.Contains(res.stderr, "install flmbox, flmbox-core and flmbox-agent in one directory") {
			t.Errorf("%v without flmbox-agent: exit %d stderr %q", args, res.code, res.stderr)
		}
	}
	for _, sub := range []string{"sandboxes", "images"} {
		if ents, _ := os.ReadDir(filepath.Join(root, sub)); len(ents) != 0 {
			t.Errorf("left in %s: %v", sub, ents)
		}
	}
	// One that is there but cannot run.
	if err := os.WriteFile(filepath.Join(dir, "flmbox-agent"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := run("doctor"); res.code != 1 || !strings.Contains(res.stdout, want+": not an executable file") {
		t.Errorf("doctor with a flmbox-agent that is not executable: exit %d\n%s", res.code, res.stdout)
	}
}
