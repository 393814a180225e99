//go:build integration

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/sandbox"
	"github.com/flmbox/flmbox/snippet/wire"
)

// treeState describes every path of a tree (the root included, as ".") by
// its type, mode, owner, size, content hash, symlink target, mtime (to the
// nanosecond) and, but for directories, link count: two equal states are
// the same tree, as far as anything reading it can tell.
func treeState(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v uid=%d gid=%d size=%d mtime=%d.%09d", fi.Mode(), st.Uid, st.Gid, fi.Size(), st.Mtim.Sec, st.Mtim.Nsec)
		if !fi.IsDir() {
			desc += fmt.Sprintf(" nlink=%d", st.Nlink) // a directory's follows from its subdirectories
		}
		switch {
		case fi.Mode().IsRegular():
			desc += " sha256=" + contentHash(t, p)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

func contentHash(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// diffTreeStates lists how after differs from before, at most 40 lines.
func diffTreeStates(before, after map[string]string) []string {
	var diffs []string
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: removed (was %s)", p, b))
		case a != b:
			diffs = append(diffs, fmt.Sprintf("%s: %s, was %s", p, a, b))
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: added (%s)", p, a))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 40 {
		diffs = append(diffs[:40], fmt.Sprintf("… and %d more", len(diffs)-40))
	}
	return diffs
}

// TestSandboxesLeaveTheCachedTreeUntouched: the cached rootfs is exactly
// what the prewarm left (every path: type, mode, owner, size, content,
// symlink target, mtime) after sandboxes were created on it, ran Python and
// shell calls, were reset, ran once with --image, fetched wheels, and were
// removed. runsc's gofer creates the destinations of bind mounts in the
// host's rootfs directory: the cache must have made them when it unpacked.
func TestSandboxesLeaveTheCachedTreeUntouched(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := unpackedSandboxRoot(t, reg)
	tree := filepath.Join(stateroot.Images(root), "rootfs", strings.TrimPrefix(img.AMD64Digest.String(), "sha256:"), "rootfs")
	before := treeState(t, tree)
	// The prewarm made the mount points of sandboxes' bind mounts, and
	// recorded them and what it made for them.
	rec := readEntry(t, tree)
	// The image has /etc/hostname and /etc/resolv.conf, not /etc/hosts;
	// empty /proc and /sys (a one-CPU sandbox's CPU files are bound there);
	// /tmp, where the sandbox's tmpfs goes.
	if got := fmt.Sprint(rec.MountPoints); got != "[/dev/.flmbox/bin/flmbox-agent (file) /dev/.flmbox/fetch (dir) /dev/.flmbox/run (dir) /dev/.flmbox/wheels (dir) "+
		"/etc/hostname (file, optional) /etc/hosts (file, optional) /etc/resolv.conf (file, optional) "+
		"/proc/cpuinfo (file, optional) /sys/devices/system/cpu/online (file, optional) /tmp (dir)]" {
		t.Errorf("recorded mount points %s", got)
	}
	if got := strings.Join(rec.Added, " "); got != "/dev/.flmbox /dev/.flmbox/bin /dev/.flmbox/bin/flmbox-agent /dev/.flmbox/fetch /dev/.flmbox/run /dev/.flmbox/wheels /etc/hosts "+
		"/proc/cpuinfo /sys/devices /sys/devices/system /sys/devices/system/cpu /sys/devices/system/cpu/online" {
		t.Errorf("recorded additions %s", got)
	}

	mustFlmbox(t, root, "sandbox", "create", "--name", "tree", "--image", reg.digestRef())
	if out := mustFlmbox(t, root, "run", "--sandbox", "tree", "-c", "import os; print(os.path.isdir('/dev/.flmbox/run'), os.path.isfile('/dev/.flmbox/bin/flmbox-agent'))"); out != "True True\n" {
		t.Fatalf("python call printed %q", out)
	}
	if out := mustFlmbox(t, root, "run", "--sandbox", "tree", "-l", "shell", "-c", "echo x > /tmp/f && cat /tmp/f"); out != "x\n" {
		t.Fatalf("shell call printed %q", out)
	}
	if out := mustFlmbox(t, root, "run", "--sandbox", "tree", "--reset", "-l", "shell", "-c", "ls /tmp"); out != "" {
		t.Fatalf("call after a reset printed %q", out)
	}
	if out := mustFlmbox(t, root, "run", "--image", reg.digestRef(), "-c", "print(6 * 7)"); out != "42\n" {
		t.Fatalf("run --image printed %q", out)
	}
	fn, wheel := testWheel("flmbox-tree", "1.0")
	ix := startIndex(t, map[string][]byte{fn: wheel})
	mustFlmbox(t, root, "pipcache", "fetch", "--image", reg.digestRef(), "--index-url", ix.simpleURL(), "flmbox-tree==1.0")
	mustFlmbox(t, root, "sandbox", "rm", "tree")
	if ls := mustFlmbox(t, root, "sandbox", "ls", "--json"); strings.TrimSpace(ls) != "[]" {
		t.Fatalf("sandboxes left: %s", ls)
	}

	if diffs := diffTreeStates(before, treeState(t, tree)); len(diffs) > 0 {
		t.Fatalf("sandboxes changed the cached rootfs %s:\n%s", tree, strings.Join(diffs, "\n"))
	}
}

// readEntry reads the image.json of the cache entry of tree.
func readEntry(t *testing.T, tree string) *rootfs.Image {
	t.Helper()
	var rec rootfs.Image
	b, err := os.ReadFile(filepath.Join(filepath.Dir(tree), "image.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		t.Fatalf("read the image.json of %s: %v", tree, err)
	}
	return &rec
}

// TestSpecMountsDestinationIsMadeOnceAndRecorded: a Spec.Mounts destination
// that the cached tree lacks is made in it, and recorded, before runsc runs;
// that is the only change, and the next sandbox with that mount changes
// nothing.
func TestSpecMountsDestinationIsMadeOnceAndRecorded(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	m, _ := newManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	store, err := m.Images()
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Prewarm(ctx, reg.digestRef(), &rootfs.PullOptions{Platform: rootfs.Platform{OS: "linux", Architecture: "amd64"}})
	if err != nil {
		t.Fatal(err)
	}
	before := treeState(t, res.Rootfs)
	recBefore := readEntry(t, res.Rootfs)
	if _, ok := before["mnt"]; !ok {
		t.Fatal("the test image has no /mnt: this test would make two paths")
	}

	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "hello"), []byte("hello from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{Image: reg.digestRef(), Mounts: []sandbox.Mount{{Source: data, Destination: "/mnt/flmbox-data"}}}
	run := func(name string) {
		t.Helper()
		spec.Name = name
		if _, err := m.Create(ctx, spec); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		r, err := m.Call(ctx, name, sandbox.Request{Language: wire.LanguageShell, Code: "cat /mnt/flmbox-data/hello"})
		if err != nil || r.ExitCode != 0 || string(r.Stdout.Data) != "hello from the host\n" {
			t.Fatalf("read the mount in %s: %+v %v", name, r, err)
		}
		if err := m.Remove(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	run("mounts-1")
	rec := readEntry(t, res.Rootfs)
	if want := append(slices.Clone(recBefore.MountPoints), rootfs.MountPoint{Path: "/mnt/flmbox-data", Type: rootfs.MountPointDir}); !slices.Equal(rec.MountPoints, want) {
		t.Errorf("recorded mount points %v, want %v", rec.MountPoints, want)
	}
	if !slices.Equal(rec.Added, append(slices.Clone(recBefore.Added), "/mnt/flmbox-data")) {
		t.Errorf("recorded additions %q", rec.Added)
	}
	after := treeState(t, res.Rootfs)
	if _, ok := after["mnt/flmbox-data"]; !ok {
		t.Fatal("the mount's destination is not in the tree")
	}
	delete(after, "mnt/flmbox-data")
	if diffs := diffTreeStates(before, after); len(diffs) > 0 {
		t.Fatalf("the cached rootfs changed beyond the recorded mount point:\n%s", strings.Join(diffs, "\n"))
	}

	again := treeState(t, res.Rootfs)
	run("mounts-2")
	if diffs := diffTreeStates(again, treeState(t, res.Rootfs)); len(diffs) > 0 {
		t.Fatalf("a second sandbox with the mount changed the cached rootfs:\n%s", strings.Join(diffs, "\n"))
	}
}
