//go:build integration

package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/mountinfo"
)

// prewarmed is a state root where the test image was prewarmed once, from
// the shared registry: sandboxRoot copies it rather than unpack the image
// again for every test (some 5 s of a 2-CPU machine's time each).
var prewarmed struct {
	once  sync.Once
	root  string
	err   error
	state string // treeDigest of its cached tree once prewarmed
}

// prewarmedRoot returns the state root that the test image was prewarmed
// into, prewarming it on the first call. Tests never use it: they use a copy.
func prewarmedRoot() (string, error) {
	prewarmed.once.Do(func() {
		prewarmed.root = filepath.Join(workDir, "prewarmed")
		if prewarmed.err = prewarmInto(prewarmed.root); prewarmed.err == nil {
			prewarmed.state, prewarmed.err = treeDigest(filepath.Join(prewarmed.root, "images", "rootfs"))
		}
	})
	return prewarmed.root, prewarmed.err
}

// checkPrewarmed fails if a test changed the files that every copy of the
// prewarmed root shares: their content, mode, owner, size or mtime.
func checkPrewarmed() error {
	if prewarmed.root == "" || prewarmed.err != nil {
		return nil
	}
	state, err := treeDigest(filepath.Join(prewarmed.root, "images", "rootfs"))
	if err != nil {
		return err
	}
	if state != prewarmed.state {
		return fmt.Errorf("the prewarmed tree that the tests' roots share was changed")
	}
	return nil
}

// treeDigest is a sha256 of every path under dir with its type, mode, owner,
// size, mtime, symlink target and content; not its link count or ctime,
// which copies change.
func treeDigest(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(h, "%s %v %d %d %d %d.%09d", p, fi.Mode(), st.Uid, st.Gid, fi.Size(), st.Mtim.Sec, st.Mtim.Nsec)
		switch {
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %s", target)
		}
		h.Write([]byte{0})
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// prewarmInto prewarms the test image's linux/amd64 manifest into the state
// root root, from the shared registry by index digest.
func prewarmInto(root string) error {
	reg, err := theSharedRegistry()
	if err != nil {
		return err
	}
	out, err := exec.Command(flmboxBin, "--root", root, "--runsc", runscPath,
		"prewarm", "--json", "--platform", "linux/amd64", reg.digestRef()).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		return fmt.Errorf("prewarm the test image: %w\n%s", err, stderr)
	}
	var res struct{ Cached bool }
	if err := json.Unmarshal(out, &res); err != nil || res.Cached {
		return fmt.Errorf("prewarm the test image printed %q: %v", out, err)
	}
	return nil
}

// copyRoot makes dst, an empty directory, a copy of the state root src:
// every directory, symlink and file with its mode, owner and times, where
// the cached trees (isCachedTree) are src's, mounted read-only
// (a sandbox mounts its tree read-only too); with linkTrees, the trees are
// copies whose files are hard links to src's.
// Every other file (records, locks, aliases) is a copy of its own, so that
// no lock, record or time is shared between two roots. A mounted tree
// cannot be removed: a test that removes the image links
// (removableSandboxRoot).
func copyRoot(src, dst string, linkTrees bool) error {
	type dirTimes struct {
		path string
		st   *syscall.Stat_t
	}
	var dirs []dirTimes
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		switch mode := fi.Mode(); {
		case mode.IsDir() && isCachedTree(rel) && !linkTrees:
			// The tree whole, read-only: a mount point shows the mounted
			// directory's mode, owner and times.
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			if err := bindReadOnly(p, target); err != nil {
				return err
			}
			return fs.SkipDir
		case mode.IsDir():
			if rel != "." {
				if err := os.Mkdir(target, 0o700); err != nil {
					return err
				}
			}
			if err := os.Chmod(target, mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
				return err
			}
			dirs = append(dirs, dirTimes{target, st})
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case mode.IsRegular() && linkTrees && inCachedTree(rel):
			return os.Link(p, target) // keeps owner, mode and times
		case mode.IsRegular():
			if err := copyFile(p, target, mode); err != nil {
				return err
			}
		default:
			return fmt.Errorf("copy %s: a %v is not expected in a state root", p, mode.Type())
		}
		if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if mode := fi.Mode(); mode.IsRegular() && mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			// chown clears them
			if err := os.Chmod(target, mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
				return err
			}
		}
		if !fi.IsDir() {
			return setTimes(target, st)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copy the state root %s: %w", src, err)
	}
	// A directory's times last: making its entries changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := setTimes(dirs[i].path, dirs[i].st); err != nil {
			return fmt.Errorf("copy the state root %s: %w", src, err)
		}
	}
	return nil
}

// isCachedTree reports whether rel, a path in a state root, is the unpacked
// tree of a cached image (images/rootfs/HEX/rootfs) or the files of a
// stored layer (images/layers/HEX/files), which the trees' files are hard
// links to.
func isCachedTree(rel string) bool {
	parts := strings.Split(rel, string(filepath.Separator))
	return len(parts) == 4 && parts[0] == "images" &&
		(parts[1] == "rootfs" && parts[3] == "rootfs" || parts[1] == "layers" && parts[3] == "files")
}

// inCachedTree reports whether rel, a path in a state root, is below the
// unpacked tree of a cached image.
func inCachedTree(rel string) bool {
	parts := strings.Split(rel, string(filepath.Separator))
	return len(parts) > 4 && isCachedTree(filepath.Join(parts[:4]...))
}

// bindReadOnly mounts directory src on target, read-only.
func bindReadOnly(src, target string) error {
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("make %s read-only: %w", target, err)
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// setTimes gives p (not followed) the access and modification times of st.
func setTimes(p string, st *syscall.Stat_t) error {
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// copyPrewarmed makes root, an empty directory, a copy of the root that
// the test image was prewarmed into, its tree mounted read-only until the
// test ends.
func copyPrewarmed(t *testing.T, root string) {
	t.Helper()
	fromPrewarmed(t, root, false)
}

// linkPrewarmed is copyPrewarmed for a test that removes the image: the
// tree is a copy whose files are hard links to the prewarmed root's
// (removing them unlinks the copy's names alone), slower to make.
func linkPrewarmed(t *testing.T, root string) {
	t.Helper()
	fromPrewarmed(t, root, true)
}

// fromPrewarmed is copyRoot of the prewarmed root into root.
func fromPrewarmed(t *testing.T, root string, linkTrees bool) {
	t.Helper()
	src, err := prewarmedRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { releaseTrees(t, root) })
	if err := copyRoot(src, root, linkTrees); err != nil {
		t.Fatal(err)
	}
}

// releaseTrees unmounts the trees that copyRoot mounted under root, where
// they are now (a removed image's tree moves to the trash); a sandbox that
// still uses one keeps it until it goes (MNT_DETACH).
func releaseTrees(t testing.TB, root string) {
	t.Helper()
	mounts, err := mountinfo.Under(root)
	if err != nil {
		t.Error(err)
	}
	for _, m := range mounts {
		if !isPrewarmedTree(m) {
			continue
		}
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", m, err)
		}
	}
}

// flmboxMounts lists the mount points at or below dir but the trees that
// copyRoot mounted: what flmbox and runsc mounted.
func flmboxMounts(t testing.TB, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(mounts, isPrewarmedTree)
}

// isPrewarmedTree reports whether the mount point p shows a cached tree of
// the prewarmed root.
func isPrewarmedTree(p string) bool {
	var st unix.Stat_t
	if prewarmed.root == "" || unix.Stat(p, &st) != nil {
		return false
	}
	trees, _ := filepath.Glob(filepath.Join(prewarmed.root, "images", "rootfs", "*", "rootfs"))
	files, _ := filepath.Glob(filepath.Join(prewarmed.root, "images", "layers", "*", "files"))
	for _, tree := range append(trees, files...) {
		var tst unix.Stat_t
		if unix.Stat(tree, &tst) == nil && tst.Dev == st.Dev && tst.Ino == st.Ino {
			return true
		}
	}
	return false
}
