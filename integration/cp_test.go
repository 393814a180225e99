//go:build integration

package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cpTimeout bounds one flmbox cp of a test: far more than any copy here
// takes, far less than the harness's 10 minutes, so that a copy that hangs
// fails its test saying so.
const cpTimeout = 2 * time.Minute

// cp runs flmbox cp ARGS with stdin (nil: none) and fails the test if it
// does not end within cpTimeout.
func cp(t *testing.T, root string, stdin []byte, args ...string) result {
	t.Helper()
	return cpWithin(t, cpTimeout, root, stdin, args...)
}

// cpWithin is cp, failing the test if flmbox cp does not end within d.
func cpWithin(t *testing.T, d time.Duration, root string, stdin []byte, args ...string) result {
	t.Helper()
	return flmboxWithin(t, d, root, stdin, append([]string{"cp"}, args...)...)
}

// flmboxWithin runs flmbox ARGS with stdin (nil: none) and fails the test
// if it does not end within d.
func flmboxWithin(t *testing.T, d time.Duration, root string, stdin []byte, args ...string) result {
	t.Helper()
	return flmboxWithinEnv(t, d, root, nil, stdin, args...)
}

// flmboxWithinEnv is flmboxWithin with env's K=V settings added to the
// test's environment.
func flmboxWithinEnv(t *testing.T, d time.Duration, root string, env []string, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, flmboxBin, append([]string{"--root", root, "--runsc", runscPath}, args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("flmbox %q hangs: killed after %s\nstderr: %s", args, d, stderr.String())
	}
	res, err := finished(&stdout, &stderr, err)
	if err != nil {
		t.Fatalf("run flmbox %q: %v", args, err)
	}
	return res
}

// mustCp runs flmbox cp and fails the test unless it exits 0 printing
// nothing on stderr.
func mustCp(t *testing.T, root string, stdin []byte, args ...string) string {
	t.Helper()
	res := cp(t, root, stdin, args...)
	if res.code != 0 || res.stderr != "" {
		t.Fatalf("flmbox cp %q: exit %d\nstderr: %s", args, res.code, res.stderr)
	}
	return res.stdout
}

// cpRefused fails the test unless flmbox cp ARGS exits 125 saying want.
func cpRefused(t *testing.T, root string, stdin []byte, want string, args ...string) {
	t.Helper()
	res := cp(t, root, stdin, args...)
	if res.code != 125 || !strings.HasPrefix(res.stderr, "flmbox: ") || !strings.Contains(res.stderr, want) {
		t.Errorf("flmbox cp %q: exit %d, stderr %q; want 125 and %q", args, res.code, res.stderr, want)
	}
}

// shell runs a shell snippet in sandbox name and returns its stdout,
// failing the test unless it exits 0.
func shell(t *testing.T, root, name, code string) string {
	t.Helper()
	res := runIn(t, root, name, code, "-l", "shell")
	if res.code != 0 {
		t.Fatalf("snippet %q: exit %d\nstdout: %s\nstderr: %s", code, res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// cpSandbox returns a state root with sandbox "s" of the test image in it,
// removed when the test ends.
func cpSandbox(t *testing.T) string {
	t.Helper()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	createSandbox(t, root, reg, "s")
	return root
}

// treeListing is the Python that describes the tree at %q as JSON: each
// path (relative, "." for the top) -> type, permission bits, owner, and a
// link's target or a file's SHA-256.
const treeListing = `
import hashlib, json, os, stat
top = %q
out = {}
def add(p):
    st = os.lstat(p)
    rel = os.path.relpath(p, top)
    v = {"mode": "%%o" %% (st.st_mode & 0o777), "uid": st.st_uid, "gid": st.st_gid}
    if stat.S_ISLNK(st.st_mode):
        v["type"], v["link"] = "link", os.readlink(p)
    elif stat.S_ISDIR(st.st_mode):
        v["type"] = "dir"
    elif stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        v["type"], v["sha256"] = "file", h.hexdigest()
    else:
        v["type"] = "other"
    out[rel] = v
add(top)
for d, dirs, files in os.walk(top):
    for n in dirs + files:
        add(os.path.join(d, n))
print(json.dumps(out, sort_keys=True))
`

// treeNode is one path of a tree listing.
type treeNode struct {
	Type   string `json:"type"`
	Mode   string `json:"mode"`
	UID    int    `json:"uid"`
	GID    int    `json:"gid"`
	Link   string `json:"link,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// sandboxTree lists the tree at p in sandbox name.
func sandboxTree(t *testing.T, root, name, p string) map[string]treeNode {
	t.Helper()
	res := runIn(t, root, name, fmt.Sprintf(treeListing, p))
	var tree map[string]treeNode
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &tree) != nil {
		t.Fatalf("list %s in the sandbox: exit %d\nstdout: %s\nstderr: %s", p, res.code, res.stdout, res.stderr)
	}
	return tree
}

// hostTree lists the tree at p on the host as sandboxTree does (owners
// left out), with each path's mtime.
func hostTree(t *testing.T, p string) (map[string]treeNode, map[string]time.Time) {
	t.Helper()
	tree, mtimes := map[string]treeNode{}, map[string]time.Time{}
	err := filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(q)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(p, q)
		n := treeNode{Mode: fmt.Sprintf("%o", fi.Mode().Perm())}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			n.Type = "link"
			n.Link, err = os.Readlink(q)
		case fi.IsDir():
			n.Type = "dir"
		case fi.Mode().IsRegular():
			n.Type = "file"
			var f *os.File
			if f, err = os.Open(q); err == nil {
				h := sha256.New()
				_, err = io.Copy(h, f)
				f.Close()
				n.SHA256 = hex.EncodeToString(h.Sum(nil))
			}
		default:
			n.Type = "other"
		}
		tree[rel], mtimes[rel] = n, fi.ModTime()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree, mtimes
}

// sameTree fails the test unless got and want list the same paths with
// the same types, modes, link targets and contents.
func sameTree(t *testing.T, what string, got, want map[string]treeNode) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		g.UID, g.GID = 0, 0
		if !ok {
			t.Errorf("%s: %s is missing", what, p)
		} else if g != w {
			t.Errorf("%s: %s is %+v, want %+v", what, p, g, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: %s should not be there", what, p)
		}
	}
}

// makeHostTree makes, at p, a tree of what cp carries: modes, links inside
// the tree (relative, absolute, dangling, to a directory), empty
// directories, a read-only directory, an empty file and a file of bigSize
// pseudo-random bytes, with set mtimes.
func makeHostTree(t *testing.T, p string, bigSize int64) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"sub/deeper", "empty", "empty-private", "ro"} {
		must(os.MkdirAll(filepath.Join(p, d), 0o755))
	}
	for f, mode := range map[string]fs.FileMode{
		"plain.txt": 0o644, "run.sh": 0o755, "private": 0o600, "readonly": 0o444, "sub/deeper/data.csv": 0o640, "ro/inside": 0o644, "emptyfile": 0o664,
	} {
		body := "contents of " + f + "\n"
		if f == "emptyfile" {
			body = ""
		}
		must(os.WriteFile(filepath.Join(p, f), []byte(body), 0o600))
		must(os.Chmod(filepath.Join(p, f), mode))
	}
	big, err := os.Create(filepath.Join(p, "sub", "big.bin"))
	must(err)
	_, err = io.CopyN(big, rand.NewChaCha8([32]byte{'f', 'l', 'm'}), bigSize)
	must(err)
	must(big.Close())
	for l, target := range map[string]string{
		"link-rel": "sub/deeper/data.csv", "sub/up": "../plain.txt", "link-dir": "sub", "dangling": "no/such/file", "link-abs": "/etc/hostname",
	} {
		must(os.Symlink(target, filepath.Join(p, l)))
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, q := range []string{"plain.txt", "sub/deeper/data.csv", "sub/deeper", "empty", "sub/big.bin"} {
		must(os.Chtimes(filepath.Join(p, q), old, old))
	}
	must(os.Chmod(filepath.Join(p, "empty-private"), 0o700))
	must(os.Chmod(filepath.Join(p, "ro"), 0o555))
	must(os.Chtimes(filepath.Join(p, "ro"), old, old))
}

// TestCpRoundTrip copies a tree into a sandbox and back out: the same
// types, modes, link targets, contents and mtimes each way; what is copied
// in belongs to the sandbox's user, who can read and change it.
func TestCpRoundTrip(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	host := t.TempDir()
	src := filepath.Join(host, "tree")
	makeHostTree(t, src, 100<<20)
	want, wantTimes := hostTree(t, src)

	if out := mustCp(t, root, nil, src, "s:/tmp/"); out != "" {
		t.Errorf("cp printed %q", out)
	}
	inside := sandboxTree(t, root, "s", "/tmp/tree")
	sameTree(t, "in the sandbox", inside, want)
	for p, n := range inside {
		if n.UID != 65534 || n.GID != 65534 {
			t.Errorf("in the sandbox, %s belongs to %d:%d, want the sandbox's user, 65534:65534", p, n.UID, n.GID)
		}
	}
	// Out again: into a host directory under its own name, and renamed.
	back := t.TempDir()
	mustCp(t, root, nil, "s:/tmp/tree", back)
	mustCp(t, root, nil, "s:/tmp/tree", filepath.Join(back, "renamed"))
	for _, p := range []string{filepath.Join(back, "tree"), filepath.Join(back, "renamed")} {
		got, gotTimes := hostTree(t, p)
		sameTree(t, "back on the host", got, want)
		for _, q := range []string{"plain.txt", "sub/deeper/data.csv", "sub/deeper", "empty", "sub/big.bin", "ro"} {
			if d := gotTimes[q].Sub(wantTimes[q]).Abs(); d >= time.Microsecond {
				t.Errorf("back on the host, %s's mtime is %v, want %v", q, gotTimes[q], wantTimes[q])
			}
		}
	}

	// The sandbox's user reads, changes and removes what was copied in.
	out := shell(t, root, "s", `set -e; cd /tmp/tree; id -u; cat plain.txt; echo more >> plain.txt; cat plain.txt
		chmod u+w readonly; echo w > readonly; cat readonly; rm sub/deeper/data.csv; mkdir empty/new; touch ro/x 2>/dev/null || echo ro-refused
		head -c 4 sub/big.bin | od -An -tx1 | tr -d ' \n'; echo`)
	firstBytes := make([]byte, 4)
	rand.NewChaCha8([32]byte{'f', 'l', 'm'}).Read(firstBytes)
	if wantOut := "65534\ncontents of plain.txt\ncontents of plain.txt\nmore\nw\nro-refused\n" + hex.EncodeToString(firstBytes) + "\n"; out != wantOut {
		t.Errorf("the snippet on the copied files printed %q, want %q", out, wantOut)
	}
	// One file, as a file of another name and into a directory.
	mustCp(t, root, nil, filepath.Join(src, "run.sh"), "s:/tmp/renamed.sh")
	mustCp(t, root, nil, filepath.Join(src, "run.sh"), "s:/tmp/tree/empty")
	if out := shell(t, root, "s", `stat -c '%a %u' /tmp/renamed.sh /tmp/tree/empty/run.sh; cat /tmp/renamed.sh /tmp/tree/empty/run.sh`); out != "755 65534\n755 65534\ncontents of run.sh\ncontents of run.sh\n" {
		t.Errorf("the file copied in alone: %q", out)
	}
}

// tarOf is the tar stream of entries (name, type, mode, body or link).
func tarOf(t *testing.T, entries ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Size, h.Linkname = int64(len(body)), ""
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// regular, directory and link are tar.Headers for tarOf; a regular file's
// body goes in Linkname.
func regular(name, body string, mode int64) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeReg, Linkname: body, Mode: mode}
}
func directory(name string) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}
}
func link(name, to string) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: to, Mode: 0o777}
}

// readTar lists a tar stream's entries: name -> "type mode body-or-link".
func readTar(t *testing.T, stream []byte) map[string]string {
	t.Helper()
	got := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(stream))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatalf("read the stream cp wrote: %v", err)
		}
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			body = string(b)
		}
		got[h.Name] = fmt.Sprintf("%c %o %s", h.Typeflag, h.Mode, body)
	}
}

// TestCpStreams: "cp - NAME:DIR" extracts a tar stream on stdin into a
// directory of the sandbox; "cp NAME:PATH -" writes PATH's tar stream to
// stdout; a hostile stream on stdin is refused, nothing written outside.
func TestCpStreams(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	shell(t, root, "s", "mkdir /tmp/d /tmp/m")
	stream := tarOf(t, regular("a.txt", "a\n", 0o644), directory("sub/"), regular("sub/b.txt", "b\n", 0o600), link("sub/l", "b.txt"))
	if out := mustCp(t, root, stream, "-", "s:/tmp/d"); out != "" {
		t.Errorf("cp - printed %q", out)
	}
	if out := shell(t, root, "s", "cat /tmp/d/a.txt /tmp/d/sub/l; stat -c '%a %u %F' /tmp/d/sub/b.txt; readlink /tmp/d/sub/l"); out != "a\nb\n600 65534 regular file\nb.txt\n" {
		t.Errorf("after cp -: %q", out)
	}
	got := readTar(t, []byte(mustCp(t, root, nil, "s:/tmp/d", "-")))
	want := map[string]string{"d/": "5 755 ", "d/a.txt": "0 644 a\n", "d/sub/": "5 755 ", "d/sub/b.txt": "0 600 b\n", "d/sub/l": "2 777 b.txt"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("cp s:/tmp/d - wrote %v, want %v", got, want)
	}
	if got := readTar(t, []byte(mustCp(t, root, nil, "s:/tmp/d/a.txt", "-"))); fmt.Sprint(got) != fmt.Sprint(map[string]string{"a.txt": "0 644 a\n"}) {
		t.Errorf("cp s:/tmp/d/a.txt - wrote %v", got)
	}
	// A stream goes into a directory, which must be there.
	cpRefused(t, root, stream, "not a directory", "-", "s:/tmp/nodir")

	// Hostile streams, into /tmp/m: nothing is written outside it (see
	// TestCpStreamsThroughLinks for links).
	for _, tc := range []struct {
		name   string
		stream []byte
		want   string
	}{
		{"dot dot", tarOf(t, regular("../evil", "x", 0o644)), `".."`},
		{"dot dot inside", tarOf(t, directory("ok/"), regular("ok/../../evil", "x", 0o644)), `".."`},
		{"absolute", tarOf(t, regular("/tmp/evil", "x", 0o644)), "an absolute name"},
		{"hard link", tarOf(t, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}), "only directories, regular files and symbolic links"},
		{"device", tarOf(t, tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}), "only directories"},
		{"fifo", tarOf(t, tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}), "only directories"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cpRefused(t, root, tc.stream, tc.want, "-", "s:/tmp/m/")
		})
	}
	// The "ok" of "ok/../../evil" was made before that entry was refused.
	if out := shell(t, root, "s", "find /tmp /etc -name 'evil*' 2>/dev/null | wc -l; ls -A /tmp/m | tr '\\n' ' '; find /tmp/m -type b -o -type c -o -type p | wc -l"); out != "0\nok 0\n" {
		t.Errorf("after the hostile streams: %q, want no evil anywhere, and /tmp/m holding only ok", out)
	}
}

// TestCpOutsideTmpAndUnreadable: a copy into a path outside /tmp is refused;
// a copy out of what the sandbox's user cannot read fails, saying why;
// links in the sandbox come out as links, never as what they point to.
func TestCpOutsideTmpAndUnreadable(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	_, runDir, _ := faultAgentPaths(t, root, "s")
	host := t.TempDir()
	f := filepath.Join(host, "f")
	if err := os.WriteFile(f, []byte("f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"s:/etc/x", "s:/etc/", "s:/", "s:/tmp/../etc/x", "s:/tmpx/f", "s:/dev/shm/f", runDir + "/x"} {
		if !strings.HasPrefix(dst, "s:") {
			dst = "s:" + dst
		}
		cpRefused(t, root, nil, "only paths under /tmp can be written", f, dst)
	}
	cpRefused(t, root, tarOf(t, regular("x", "x", 0o644)), "only paths under /tmp can be written", "-", "s:/etc/")
	if out := shell(t, root, "s", "test ! -e /etc/x && test ! -e /etc/f && test ! -e /x && test ! -e /f && echo clean"); out != "clean\n" {
		t.Errorf("a refused copy wrote outside /tmp: %q", out)
	}

	out := filepath.Join(host, "out")
	for _, tc := range []struct{ src, want string }{
		{"s:/etc/shadow", "permission denied"},
		{"s:/tmp/nosuch", "no such file or directory"},
		{"s:" + runDir, "permission denied"},
		{"s:" + runDir + "/agent.sock", "permission denied"},
	} {
		res := cp(t, root, nil, tc.src, out)
		if res.code != 125 || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("cp %s %s: exit %d, stderr %q; want 125 and %q", tc.src, out, res.code, res.stderr, tc.want)
		}
		if _, err := os.Lstat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cp %s %s made %s (%v)", tc.src, out, out, err)
			os.RemoveAll(out)
		}
	}

	// Links come out as links: at the top, and inside a tree.
	shell(t, root, "s", "set -e; mkdir /tmp/out; echo f > /tmp/out/f; ln -s /etc /tmp/out/etc; ln -s /etc/passwd /tmp/out/passwd; ln -s /etc /tmp/outlink")
	mustCp(t, root, nil, "s:/tmp/out", host)
	mustCp(t, root, nil, "s:/tmp/outlink", filepath.Join(host, "ol"))
	mustCp(t, root, nil, "s:/tmp/outlink", filepath.Join(host, "out"))
	for p, want := range map[string]string{"out/etc": "/etc", "out/passwd": "/etc/passwd", "ol": "/etc", "out/outlink": "/etc"} {
		if got, err := os.Readlink(filepath.Join(host, p)); err != nil || got != want {
			t.Errorf("on the host, %s: %q, %v; want a link to %s", p, got, err, want)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(host, "out"))
	if len(ents) != 4 {
		t.Errorf("on the host, out holds %v; want f, etc, passwd and outlink", ents)
	}
}

// TestCpLimits: a copy past --max-size fails, each way and from a stream,
// saying so; a copy on a sandbox that is not there fails with exit 125.
func TestCpLimits(t *testing.T) {
	t.Parallel()
	root := cpSandbox(t)
	host := t.TempDir()
	big := filepath.Join(host, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	shell(t, root, "s", "mkdir /tmp/in; head -c 2097152 /dev/zero > /tmp/big")

	// (A host file past --max-size: TestCpMaxSizeOnTheHost.)
	cpRefused(t, root, tarOf(t, regular("a", strings.Repeat("a", 600<<10), 0o644), regular("b", strings.Repeat("b", 600<<10), 0o644)),
		"over 1048576 bytes", "--max-size", "1MiB", "-", "s:/tmp/in/")
	if out := shell(t, root, "s", "ls -A /tmp/in | tr '\\n' ' '"); out != "a " {
		t.Errorf("after the copies past --max-size, /tmp/in holds %q", out)
	}
	cpRefused(t, root, nil, "over 1048576 bytes", "--max-size", "1MiB", "s:/tmp/big", filepath.Join(host, "back"))
	if _, err := os.Lstat(filepath.Join(host, "back")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a copy out past --max-size wrote %s (%v)", filepath.Join(host, "back"), err)
	}
	res := cp(t, root, nil, "--max-size", "1MiB", "s:/tmp/big", "-")
	if res.code != 125 || !strings.Contains(res.stderr, "over 1048576 bytes") {
		t.Errorf("cp s:/tmp/big - past --max-size: exit %d, stderr %q", res.code, res.stderr)
	}
	// Within the bound, all goes.
	mustCp(t, root, nil, "--max-size", "2MiB", big, "s:/tmp/in/")
	mustCp(t, root, nil, "--max-size", "2MiB", "s:/tmp/big", filepath.Join(host, "back"))

	cpRefused(t, root, nil, `no sandbox "nosuch"`, big, "nosuch:/tmp/")
	cpRefused(t, root, nil, `no sandbox "nosuch"`, "nosuch:/tmp/big", host)
	cpRefused(t, root, tarOf(t, regular("a", "a", 0o644)), `no sandbox "nosuch"`, "-", "nosuch:/tmp/")
}
