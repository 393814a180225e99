package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// sandboxPoints are mount points like flmbox's: a file and directories
// below a directory that the image does not have.
var sandboxPoints = []MountPoint{
	{Path: "/dev/.flmbox/bin/agent", Type: MountPointFile},
	{Path: "/dev/.flmbox/run", Type: MountPointDir},
	{Path: "/dev/.flmbox/wheels", Type: MountPointDir},
}

// treeOf describes every path of the tree at root (type, mode, size,
// content, symlink target, mtime to the nanosecond), the root included as
// ".", leaving out the paths of skip.
func treeOf(t *testing.T, root string, skip []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if slices.Contains(skip, "/"+rel) {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v %d %d.%09d", fi.Mode(), fi.Size(), st.Mtim.Sec, st.Mtim.Nsec)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readImageJSON(t *testing.T, s *Store, manifest string) *Image {
	t.Helper()
	var img Image
	if err := readJSON(filepath.Join(s.entryDir(strings.TrimPrefix(manifest, "sha256:")), "image.json"), &img); err != nil {
		t.Fatal(err)
	}
	return &img
}

// TestPrewarmMakesMountPoints: a new entry has the Store's mount points,
// records them and every path made for them, and is otherwise the tree a
// Store without mount points unpacks, directory times included.
func TestPrewarmMakesMountPoints(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	ctx := context.Background()
	plain := newTestStore(t)
	want, err := plain.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenStore(filepath.Join(t.TempDir(), "images"), WithMountPoints(sandboxPoints...))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	for _, mp := range sandboxPoints {
		fi, err := os.Lstat(filepath.Join(res.Rootfs, mp.Path))
		switch {
		case err != nil:
			t.Errorf("%s: %v", mp, err)
		case mp.Type == MountPointDir && (!fi.IsDir() || fi.Mode().Perm() != 0o755):
			t.Errorf("%s: mode %v, want a directory 0755", mp, fi.Mode())
		case mp.Type == MountPointFile && (!fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 || fi.Size() != 0):
			t.Errorf("%s: mode %v size %d, want an empty file 0644", mp, fi.Mode(), fi.Size())
		}
	}
	rec := readImageJSON(t, s, res.ManifestDigest)
	if !slices.Equal(rec.MountPoints, sandboxPoints) {
		t.Errorf("recorded mount points %v, want %v", rec.MountPoints, sandboxPoints)
	}
	wantAdded := []string{"/dev", "/dev/.flmbox", "/dev/.flmbox/bin", "/dev/.flmbox/bin/agent", "/dev/.flmbox/run", "/dev/.flmbox/wheels"}
	if !slices.Equal(rec.Added, wantAdded) {
		t.Errorf("recorded additions %q, want %q", rec.Added, wantAdded)
	}
	if rec.Rootfs != "" || !rec.LastUsed.IsZero() {
		t.Errorf("image.json holds fields it should not: %+v", rec)
	}
	// Exactly the recorded additions, nothing more. (The layers set every
	// time but the root's and that of etc, where a whiteout removed a file:
	// those are the times of each pull.)
	got, exp := treeOf(t, res.Rootfs, rec.Added), treeOf(t, want.Rootfs, nil)
	for _, p := range []string{".", "etc"} {
		delete(got, p)
		delete(exp, p)
	}
	if !maps.Equal(got, exp) {
		t.Errorf("tree with mount points, their additions left out:\n%v\nwant\n%v", got, exp)
	}

	// A cached entry is returned as it is: nothing made, nothing written.
	before := treeOf(t, res.Rootfs, nil)
	again, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64, Offline: true})
	if err != nil || !again.Cached {
		t.Fatalf("cached prewarm: %+v %v", again, err)
	}
	if after := treeOf(t, res.Rootfs, nil); !maps.Equal(before, after) {
		t.Errorf("a cached prewarm changed the tree")
	}

	// A mount point of this pull alone is added to the cached entry and
	// recorded; the root directory keeps its times.
	extra := MountPoint{Path: "/srv/data", Type: MountPointDir}
	if _, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64, Offline: true, MountPoints: []MountPoint{extra}}); err != nil {
		t.Fatal(err)
	}
	rec = readImageJSON(t, s, res.ManifestDigest)
	if !slices.Equal(rec.MountPoints, append(slices.Clone(sandboxPoints), extra)) || !slices.Equal(rec.Added, append(wantAdded, "/srv", "/srv/data")) {
		t.Errorf("after an extra mount point: recorded %v, added %q", rec.MountPoints, rec.Added)
	}
	after := treeOf(t, res.Rootfs, nil)
	if after["."] != before["."] {
		t.Errorf("root %s, was %s", after["."], before["."])
	}
	for _, p := range []string{"srv", "srv/data"} {
		if after[p] == "" {
			t.Errorf("%s was not made", p)
		}
		delete(after, p)
	}
	if !maps.Equal(before, after) {
		t.Errorf("an extra mount point changed more than its additions")
	}
}

// TestOldEntryGetsMountPoints: an entry that an earlier flmbox cached (no
// record) gets the Store's mount points on its next prewarm, offline,
// under its lock, recorded in its image.json, and nothing else changes.
func TestOldEntryGetsMountPoints(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "images")
	old, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	res, err := old.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	oldRec := readImageJSON(t, old, res.ManifestDigest)
	if oldRec.MountPoints != nil || oldRec.Added != nil {
		t.Fatalf("a store without mount points recorded %v %v", oldRec.MountPoints, oldRec.Added)
	}
	before := treeOf(t, res.Rootfs, nil)
	r.Close()

	s, err := OpenStore(dir, WithMountPoints(sandboxPoints...))
	if err != nil {
		t.Fatal(err)
	}
	// Its lock is taken: the upgrade waits for it.
	unlock, err := s.lock(ctx, strings.TrimPrefix(res.ManifestDigest, "sha256:"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = s.Prewarm(wctx, ref, &PullOptions{Platform: amd64, Offline: true})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an upgrade while the entry is locked: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(res.Rootfs, "dev")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an upgrade changed the tree without the lock: %v", err)
	}
	unlock()

	again, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64, Offline: true})
	if err != nil || !again.Cached || again.Rootfs != res.Rootfs {
		t.Fatalf("upgrade: %+v %v", again, err)
	}
	rec := readImageJSON(t, s, res.ManifestDigest)
	want := *oldRec
	want.MountPoints = sandboxPoints
	want.Added = []string{"/dev", "/dev/.flmbox", "/dev/.flmbox/bin", "/dev/.flmbox/bin/agent", "/dev/.flmbox/run", "/dev/.flmbox/wheels"}
	if fmt.Sprint(*rec) != fmt.Sprint(want) {
		t.Errorf("record after the upgrade %+v, want %+v", *rec, want)
	}
	if after := treeOf(t, res.Rootfs, rec.Added); !maps.Equal(before, after) {
		t.Errorf("the upgrade changed more than its additions:\n%v\nwant\n%v", after, before)
	}
}

// TestMountPointsAgainstTheImage: mount points in trees that already have
// something at their paths, or symlinks on the way. Symlinks lead inside
// the tree; a last component is never followed; a wrong type fails with a
// failed precondition naming the path, before anything is made.
func TestMountPointsAgainstTheImage(t *testing.T) {
	dirPoint := func(p string) MountPoint { return MountPoint{Path: p, Type: MountPointDir} }
	filePoint := func(p string) MountPoint { return MountPoint{Path: p, Type: MountPointFile} }
	for _, c := range []struct {
		name    string
		layer   []tarEntry
		points  []MountPoint
		added   []string          // on success
		made    []string          // paths in the tree that must be of the points' types
		skipped []string          // optional points left alone
		moved   map[string]string // optional points made at their symlink's target
		errText string            // on failure
	}{{
		name:   "existing directory and file are kept",
		layer:  ents(dirEnt("dev/", 0o700), dirEnt("dev/run/", 0o700), fileEnt("dev/agent", "image's", 0o600)),
		points: []MountPoint{dirPoint("/dev/run"), filePoint("/dev/agent")},
	}, {
		name:   "dev is an absolute symlink that climbs out",
		layer:  ents(dirEnt("usr/", 0o755), dirEnt("usr/dev/", 0o755), symEnt("dev", "/../../../usr/dev")),
		points: []MountPoint{dirPoint("/dev/.flmbox/run"), filePoint("/dev/.flmbox/agent")},
		added:  []string{"/usr/dev/.flmbox", "/usr/dev/.flmbox/agent", "/usr/dev/.flmbox/run"},
		made:   []string{"usr/dev/.flmbox/run", "usr/dev/.flmbox/agent"},
	}, {
		name:   "dev is a relative symlink to the host's directory beside the tree",
		layer:  ents(dirEnt("outside/", 0o755), symEnt("dev", "../outside")),
		points: []MountPoint{dirPoint("/dev/.flmbox/run")},
		added:  []string{"/outside/.flmbox", "/outside/.flmbox/run"},
		made:   []string{"outside/.flmbox/run"},
	}, {
		name:   "dev/.flmbox is a symlink to the host's directory by its absolute path",
		layer:  ents(dirEnt("dev/", 0o755), dirEnt(tmpPH+"/outside/", 0o755), symEnt("dev/.flmbox", tmpPH+"/outside")),
		points: []MountPoint{dirPoint("/dev/.flmbox/run")},
		added:  []string{tmpPH + "/outside/run"},
		made:   []string{tmpPH + "/outside/run"},
	}, {
		name:    "dev/.flmbox is a symlink to a missing directory",
		layer:   ents(dirEnt("dev/", 0o755), symEnt("dev/.flmbox", tmpPH+"/outside")),
		points:  []MountPoint{dirPoint("/dev/.flmbox/run")},
		errText: "mount point /dev/.flmbox/run: the image's symlink /dev/.flmbox does not lead to a directory in the image",
	}, {
		name:    "the mount point is a symlink to a directory",
		layer:   ents(dirEnt("dev/", 0o755), dirEnt("real/", 0o755), symEnt("dev/run", "/real")),
		points:  []MountPoint{dirPoint("/dev/run")},
		errText: "mount point /dev/run: the image has a symlink at /dev/run, where it needs a directory",
	}, {
		name:    "the mount point is a symlink to the host",
		layer:   ents(dirEnt("dev/", 0o755), symEnt("dev/agent", tmpPH+"/outside/secret")),
		points:  []MountPoint{filePoint("/dev/agent")},
		errText: "mount point /dev/agent: the image has a symlink at /dev/agent, where it needs a regular file",
	}, {
		name:    "a file where a directory is needed",
		layer:   ents(fileEnt("dev", "x", 0o644)),
		points:  []MountPoint{dirPoint("/dev/.flmbox/run")},
		errText: "mount point /dev/.flmbox/run: the image has a regular file at /dev, where it needs a directory",
	}, {
		name:    "a directory where a file is needed",
		layer:   ents(dirEnt("dev/", 0o755), dirEnt("dev/agent/", 0o755)),
		points:  []MountPoint{filePoint("/dev/agent")},
		errText: "mount point /dev/agent: the image has a directory at /dev/agent, where it needs a regular file",
	}, {
		name:   "an optional file that the image has as a symlink is made at its target",
		layer:  ents(dirEnt("etc/", 0o755), symEnt("etc/resolv.conf", "../run/systemd/resolve/stub-resolv.conf"), fileEnt("etc/hosts", "image's", 0o644)),
		points: []MountPoint{optional(filePoint("/etc/resolv.conf")), optional(filePoint("/etc/hosts")), optional(filePoint("/etc/hostname")), dirPoint("/dev/run")},
		added:  []string{"/dev", "/dev/run", "/etc/hostname", "/run", "/run/systemd", "/run/systemd/resolve", "/run/systemd/resolve/stub-resolv.conf"},
		made:   []string{"etc/hostname", "dev/run", "run/systemd/resolve/stub-resolv.conf"},
		moved:  map[string]string{"/etc/resolv.conf": "/run/systemd/resolve/stub-resolv.conf"},
	}, {
		name: "an optional file whose symlink leads below a runtime's mount, or to a symlink, is skipped",
		layer: ents(dirEnt("etc/", 0o755), symEnt("etc/resolv.conf", "/tmp/resolv.conf"), symEnt("etc/hosts", "hosts2"),
			symEnt("etc/hosts2", "hosts3")),
		points:  []MountPoint{optional(filePoint("/etc/resolv.conf")), optional(filePoint("/etc/hosts"))},
		skipped: []string{"/etc/hosts", "/etc/resolv.conf"},
	}, {
		name:    "optional files below a file are skipped",
		layer:   ents(fileEnt("etc", "x", 0o644)),
		points:  []MountPoint{optional(filePoint("/etc/hosts")), optional(filePoint("/etc/hostname"))},
		skipped: []string{"/etc/hostname", "/etc/hosts"},
	}, {
		name:    "a refusal makes nothing, not even the points before it",
		layer:   ents(fileEnt("zzz", "x", 0o644)),
		points:  []MountPoint{dirPoint("/aaa/run"), dirPoint("/zzz")},
		errText: "mount point /zzz: the image has a regular file at /zzz, where it needs a directory",
	}} {
		t.Run(c.name, func(t *testing.T) {
			e := newUnpackEnv(t)
			if _, err := e.applyAll(t, nil, [][]byte{e.tar(t, c.layer)}); err != nil {
				t.Fatal(err)
			}
			before := treeOf(t, e.root, nil)
			points, err := checkMountPoints(c.points)
			if err != nil {
				t.Fatal(err)
			}
			p, err := prepareMountPoints(e.root, points)
			done, added := p.done, p.added
			e.checkSentinel(t)
			if c.errText != "" {
				if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), e.expand(c.errText)) {
					t.Fatalf("error %v, want a failed precondition saying %q", err, e.expand(c.errText))
				}
				if done != nil || added != nil || p.skipped != nil || !maps.Equal(treeOf(t, e.root, nil), before) {
					t.Fatalf("a refusal made %v %q, or changed the tree", done, added)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var wantAdded []string
			for _, a := range c.added {
				wantAdded = append(wantAdded, e.expand(a))
			}
			var wantDone []MountPoint
			var skipped []string
			for _, mp := range points {
				if slices.Contains(c.skipped, mp.Path) {
					continue
				}
				if to, ok := c.moved[mp.Path]; ok {
					mp = MountPoint{Path: to, Type: mp.Type}
				}
				wantDone = append(wantDone, mp)
			}
			moved := map[string]string{}
			for _, m := range p.moved {
				moved[m.MountPoint.Path] = m.To
			}
			if len(moved) != len(c.moved) || !maps.Equal(moved, c.moved) && len(c.moved) > 0 {
				t.Errorf("moved %v, want %v", moved, c.moved)
			}
			for _, mp := range p.skipped {
				skipped = append(skipped, mp.Path)
			}
			if !slices.Equal(done, wantDone) || !slices.Equal(added, wantAdded) || !slices.Equal(skipped, c.skipped) {
				t.Fatalf("made %v, added %q, skipped %q; want %v, %q, %q", done, added, skipped, wantDone, wantAdded, c.skipped)
			}
			for _, p := range c.made {
				if _, err := os.Lstat(filepath.Join(e.root, e.expand(p))); err != nil {
					t.Errorf("%s was not made in the tree: %v", p, err)
				}
			}
			after := treeOf(t, e.root, added)
			if !maps.Equal(before, after) {
				t.Errorf("the tree changed beyond its additions:\n%v\nwant\n%v", after, before)
			}
			// A second preparation finds everything in place.
			if p, err := prepareMountPoints(e.root, points); err != nil || len(p.added) != 0 || !slices.Equal(p.done, wantDone) {
				t.Errorf("second preparation: %v %q %v", p.done, p.added, err)
			}
		})
	}
}

// TestMountPointRefusalInAPull: an image that has a mount point's path with
// another type fails its pull, naming the path, and leaves nothing.
func TestMountPointRefusalInAPull(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s, err := OpenStore(filepath.Join(t.TempDir(), "images"), WithMountPoints(MountPoint{Path: "/etc/hello", Type: MountPointDir}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Prewarm(context.Background(), ref, &PullOptions{Platform: amd64})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "the image has a regular file at /etc/hello, where it needs a directory") {
		t.Fatalf("pull of an image with a file at a mount point: %v", err)
	}
	assertClean(t, s)
}

// TestOptionalMountPointInAPull: an optional mount point that the image has
// with another type is skipped and recorded as such; the pull succeeds and
// the next prewarm does not try it again.
func TestOptionalMountPointInAPull(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	mp := MountPoint{Path: "/etc/hello", Type: MountPointDir, Optional: true}
	s, err := OpenStore(filepath.Join(t.TempDir(), "images"), WithMountPoints(mp))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		res, err := s.Prewarm(context.Background(), ref, &PullOptions{Platform: amd64})
		if err != nil {
			t.Fatalf("prewarm %d: %v", i, err)
		}
		rec := readImageJSON(t, s, res.ManifestDigest)
		if !slices.Equal(res.Skipped, []MountPoint{mp}) || !slices.Equal(rec.Skipped, []MountPoint{mp}) || len(rec.MountPoints) != 0 || len(rec.Added) != 0 {
			t.Fatalf("prewarm %d: skipped %v (recorded %v), made %v, added %q", i, res.Skipped, rec.Skipped, rec.MountPoints, rec.Added)
		}
		if fi, err := os.Lstat(filepath.Join(res.Rootfs, "etc/hello")); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("the image's /etc/hello: %v %v", fi, err)
		}
	}
}

func TestCheckMountPoints(t *testing.T) {
	for _, bad := range [][]MountPoint{
		{{Path: "dev/x", Type: MountPointDir}},
		{{Path: "/dev/../x", Type: MountPointDir}},
		{{Path: "/dev/x/", Type: MountPointDir}},
		{{Path: "/", Type: MountPointDir}},
		{{Path: "", Type: MountPointDir}},
		{{Path: "/a\x00b", Type: MountPointDir}},
		{{Path: "/" + strings.Repeat("n", 256), Type: MountPointDir}},
		{{Path: "/dev/x", Type: "socket"}},
		{{Path: "/dev/x", Type: MountPointDir}, {Path: "/dev/x", Type: MountPointFile}},
		{{Path: "/dev/x/y", Type: MountPointDir}, {Path: "/dev/x", Type: MountPointFile}},
	} {
		if _, err := checkMountPoints(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want an invalid argument", bad, err)
		}
		if _, err := OpenStore(filepath.Join(t.TempDir(), "images"), WithMountPoints(bad...)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("OpenStore with %q: %v, want an invalid argument", bad, err)
		}
	}
	got, err := checkMountPoints([]MountPoint{{"/b", MountPointDir, false}, {"/a/x", MountPointFile, true}, {"/b", MountPointDir, false}, {"/a", MountPointDir, false}, {"/a/x", MountPointFile, false}})
	if want := []MountPoint{{"/a", MountPointDir, false}, {"/a/x", MountPointFile, false}, {"/b", MountPointDir, false}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("checkMountPoints: %v %v, want %v", got, err, want)
	}
}

// TestPrepareMountPointsClosesItsDescriptors: making mount points leaves no
// descriptor open (FuzzUnpack ran out of them).
func TestPrepareMountPointsClosesItsDescriptors(t *testing.T) {
	count := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := count()
	for range 20 {
		if _, err := prepareMountPoints(t.TempDir(), fuzzMountPoints); err != nil {
			t.Fatal(err)
		}
	}
	if after := count(); after > before+2 {
		t.Fatalf("%d descriptors open before, %d after making mount points 20 times", before, after)
	}
}

// optional is mp made optional.
func optional(mp MountPoint) MountPoint {
	mp.Optional = true
	return mp
}
