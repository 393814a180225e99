package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	kgzip "github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// The unpacker tests build layer tars in memory and apply them to TMP/root,
// next to a sentinel directory TMP/outside holding a host file
// TMP/outside/secret. After every case the sentinel must be untouched and TMP
// must hold nothing but root/ and outside/.
//
// Entry names, link targets, expected paths and expected error texts may
// contain tmpPH, which stands for the real absolute path of TMP
// ("/tmp/TestX/001"); an expected path "@TMP@/outside/secret" therefore means
// TMP/root/tmp/TestX/001/outside/secret, where a write through a symlink to
// the host's TMP/outside must land.
const tmpPH = "@TMP@"

const secretContent = "secret"

// sentinelTime is the mtime given to the sentinel file and directory, so that
// a write, a touch or a new file in TMP/outside shows.
var sentinelTime = time.Unix(1_000_000_000, 0)

// implicitDirMode is the mode of a parent directory the unpacker creates for
// an entry without a directory header: 0755 minus the umask.
var implicitDirMode = 0o755 &^ processUmask()

// tarEntry is one entry of a layer built by a test.
type tarEntry struct {
	hdr    tar.Header
	body   string
	retype byte // typeflag patched into the written header, if not 0
}

func fileEnt(name, body string, mode int64) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, body: body}
}

func dirEnt(name string, mode int64) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}

func symEnt(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func linkEnt(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644}}
}

// whEnt is a whiteout or opaque marker: an empty regular file.
func whEnt(name string) tarEntry { return fileEnt(name, "", 0o644) }

func devEnt(name string, typ byte) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: typ, Name: name, Mode: 0o666, Devmajor: 1, Devminor: 3}}
}

// retyped marks te to be written with typeflag typ, which tar.Writer would
// refuse for its name ("./" as a regular file).
func retyped(te tarEntry, typ byte) tarEntry { te.retype = typ; return te }

func (te tarEntry) at(t time.Time) tarEntry { te.hdr.ModTime = t; return te }

func (te tarEntry) owner(uid, gid int) tarEntry { te.hdr.Uid, te.hdr.Gid = uid, gid; return te }

// buildTar serializes entries as a tar stream, end-of-archive marker
// included, after passing names and link targets through expand.
func buildTar(tb testing.TB, entries []tarEntry, expand func(string) string) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, te := range entries {
		h := te.hdr
		h.Name, h.Linkname = expand(h.Name), expand(h.Linkname)
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(te.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			tb.Fatalf("write tar header %q: %v", h.Name, err)
		}
		if te.retype != 0 {
			patchTypeflag(buf.Bytes()[buf.Len()-512:], te.retype)
		}
		if _, err := io.WriteString(tw, te.body); err != nil {
			tb.Fatalf("write tar content %q: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatalf("close tar: %v", err)
	}
	return buf.Bytes()
}

// patchTypeflag sets the typeflag of a USTAR header block and recomputes its
// checksum.
func patchTypeflag(blk []byte, typ byte) {
	blk[156] = typ
	copy(blk[148:156], "        ")
	var sum int64
	for _, b := range blk[:512] {
		sum += int64(b)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// sparseTar returns a layer holding one PAX 1.0 sparse file of realSize
// logical bytes: a hole, then 512 bytes of data at the end. tar.Writer cannot
// write sparse files, so the PAX header is a regular entry retyped.
func sparseTar(tb testing.TB, name string, realSize int64) []byte {
	tb.Helper()
	var pax strings.Builder
	for _, kv := range [][2]string{
		{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"},
		{"GNU.sparse.name", name}, {"GNU.sparse.realsize", strconv.FormatInt(realSize, 10)},
	} {
		rec := " " + kv[0] + "=" + kv[1] + "\n"
		n := len(rec) + 1
		for len(strconv.Itoa(n))+len(rec) != n {
			n++
		}
		pax.WriteString(strconv.Itoa(n) + rec)
	}
	sparseMap := []byte(fmt.Sprintf("1\n%d\n512\n", realSize-512))
	data := append(append(sparseMap, make([]byte, 512-len(sparseMap))...), bytes.Repeat([]byte{'z'}, 512)...)
	return buildTar(tb, ents(
		retyped(fileEnt("PaxHeaders/"+name, pax.String(), 0o644), tar.TypeXHeader),
		fileEnt("GNUSparseFile.0/"+name, string(data), 0o644),
	), func(s string) string { return s })
}

// y2300 is a time that fits the file systems but not int64 nanoseconds.
var y2300 = time.Date(2300, 6, 7, 8, 9, 10, 0, time.UTC)

// storedTime is the mtime the file system of the temporary directories
// keeps when it is set to t.
func storedTime(tb testing.TB, t time.Time) time.Time {
	tb.Helper()
	dir := tb.TempDir()
	ts, err := unix.TimeToTimespec(t)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dir, []unix.Timespec{ts, ts}, 0); err != nil {
		tb.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return fi.ModTime()
}

// unpackEnv is TMP with root/ and the sentinel outside/.
type unpackEnv struct {
	tmp, root, outside, secret string
	warnings                   []string
	secretIno                  uint64
	// ctimes of the sentinel file and directory: any change of content,
	// mode, owner, times or link count moves them.
	secretCtime, outsideCtime unix.Timespec
	// stored applies layers from a layer store (storeLayer, ApplyStored).
	stored bool
}

func newUnpackEnv(tb testing.TB) *unpackEnv {
	tb.Helper()
	return newUnpackEnvIn(tb, tb.TempDir())
}

// newUnpackEnvIn is newUnpackEnv in dir, an empty directory.
func newUnpackEnvIn(tb testing.TB, dir string) *unpackEnv {
	tb.Helper()
	tmp, err := filepath.EvalSymlinks(dir)
	if err != nil {
		tb.Fatal(err)
	}
	e := &unpackEnv{
		tmp:     tmp,
		root:    filepath.Join(tmp, "root"),
		outside: filepath.Join(tmp, "outside"),
		secret:  filepath.Join(tmp, "outside", "secret"),
	}
	for _, d := range []string{e.root, e.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.WriteFile(e.secret, []byte(secretContent), 0o640); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(e.secret, 0o640); err != nil {
		tb.Fatal(err)
	}
	for _, p := range []string{e.secret, e.outside} {
		if err := os.Chtimes(p, sentinelTime, sentinelTime); err != nil {
			tb.Fatal(err)
		}
	}
	fi, err := os.Lstat(e.secret)
	if err != nil {
		tb.Fatal(err)
	}
	e.secretIno = fi.Sys().(*syscall.Stat_t).Ino
	e.secretCtime, e.outsideCtime = ctime(tb, e.secret), ctime(tb, e.outside)
	// Without root, directories the layers made read-only would defeat the
	// removal of TMP; cleanups run last in, first out.
	tb.Cleanup(func() { makeRemovable(e.root) })
	return e
}

func makeRemovable(root string) {
	if os.Geteuid() == 0 {
		return
	}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
}

// expand replaces tmpPH in a name or link target by TMP's absolute path.
func (e *unpackEnv) expand(s string) string { return strings.ReplaceAll(s, tmpPH, e.tmp) }

// rel turns an expected path into a path relative to root ("" for root).
func (e *unpackEnv) rel(p string) string {
	return strings.TrimPrefix(path.Clean("/"+e.expand(p)), "/")
}

func (e *unpackEnv) tar(tb testing.TB, entries []tarEntry) []byte {
	return buildTar(tb, entries, e.expand)
}

// applyAll applies layers in order with a fresh Unpacker. It returns the
// first error and the index of the layer that returned it.
func (e *unpackEnv) applyAll(tb testing.TB, opts *UnpackOptions, layers [][]byte) (int, error) {
	tb.Helper()
	var o UnpackOptions
	if opts != nil {
		o = *opts
	}
	if o.Warnf == nil {
		o.Warnf = func(format string, args ...any) {
			e.warnings = append(e.warnings, fmt.Sprintf(format, args...))
		}
	}
	u, err := NewUnpacker(e.root, &o)
	if err != nil {
		tb.Fatalf("NewUnpacker: %v", err)
	}
	defer u.Close()
	for i, l := range layers {
		if e.stored {
			dir := tb.TempDir()
			if _, err := storeLayer(context.Background(), bytes.NewReader(l), dir, &o); err != nil {
				return i, err
			}
			if err := u.ApplyStored(context.Background(), dir); err != nil {
				return i, err
			}
			continue
		}
		if err := u.Apply(context.Background(), bytes.NewReader(l)); err != nil {
			return i, err
		}
	}
	return -1, nil
}

// checkSentinel asserts that the host file and directory outside root are
// untouched, that root is still a directory, and that TMP holds nothing new.
func (e *unpackEnv) checkSentinel(tb testing.TB) {
	tb.Helper()
	if b, err := os.ReadFile(e.secret); err != nil || string(b) != secretContent {
		tb.Errorf("sentinel %s: content %q, %v; want %q", e.secret, b, err, secretContent)
	}
	if fi, err := os.Lstat(e.secret); err != nil {
		tb.Errorf("sentinel: %v", err)
	} else {
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.Mode().IsRegular() || st.Mode&0o7777 != 0o640 {
			tb.Errorf("sentinel %s: mode %s (%#o), want a regular file 0640", e.secret, fi.Mode(), st.Mode&0o7777)
		}
		if st.Nlink != 1 || st.Ino != e.secretIno {
			tb.Errorf("sentinel %s: inode %d with %d links, want inode %d with 1 link", e.secret, st.Ino, st.Nlink, e.secretIno)
		}
		if !fi.ModTime().Equal(sentinelTime) {
			tb.Errorf("sentinel %s: mtime %v, want %v", e.secret, fi.ModTime(), sentinelTime)
		}
	}
	if fi, err := os.Lstat(e.outside); err != nil {
		tb.Errorf("sentinel: %v", err)
	} else if st := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || st.Mode&0o7777 != 0o755 || !fi.ModTime().Equal(sentinelTime) {
		tb.Errorf("sentinel directory %s: mode %s (%#o), mtime %v; want a directory 0755, mtime %v",
			e.outside, fi.Mode(), st.Mode&0o7777, fi.ModTime(), sentinelTime)
	}
	if got := ctime(tb, e.secret); got != e.secretCtime {
		tb.Errorf("sentinel %s: ctime moved from %v to %v: its inode was changed", e.secret, e.secretCtime, got)
	}
	if got := ctime(tb, e.outside); got != e.outsideCtime {
		tb.Errorf("sentinel directory %s: ctime moved from %v to %v: it was changed", e.outside, e.outsideCtime, got)
	}
	if names := dirNames(tb, e.outside); !slices.Equal(names, []string{"secret"}) {
		tb.Errorf("sentinel directory %s holds %q, want only secret", e.outside, names)
	}
	if names := dirNames(tb, e.tmp); !slices.Equal(names, []string{"outside", "root"}) {
		tb.Errorf("%s holds %q, want only outside and root", e.tmp, names)
	}
	if fi, err := os.Lstat(e.root); err != nil || !fi.IsDir() {
		tb.Errorf("root %s is no longer a directory: %v", e.root, err)
	}
}

func ctime(tb testing.TB, p string) unix.Timespec {
	tb.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		tb.Errorf("stat %s: %v", p, err)
	}
	return st.Ctim
}

func dirNames(tb testing.TB, dir string) []string {
	tb.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Errorf("list %s: %v", dir, err)
		return nil
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	return names
}

// node is the expected state of one path under root.
type node struct {
	path   string
	kind   byte // 'f' regular file, 'd' directory, 'l' symlink, 0 absent
	body   string
	mode   uint32 // permission and special bits (07777)
	noMode bool
	target string    // symlink target, verbatim
	sameAs string    // another path that must be the same inode
	mtime  time.Time // zero: not checked
	uid    int       // checked as root only, when ownerSet
	gid    int
	owned  bool
}

func wFile(p, body string, mode uint32) node { return node{path: p, kind: 'f', body: body, mode: mode} }
func wDir(p string, mode uint32) node        { return node{path: p, kind: 'd', mode: mode} }
func wSym(p, target string) node             { return node{path: p, kind: 'l', target: target, noMode: true} }
func wGone(p string) node                    { return node{path: p} }

func (n node) sameInode(p string) node   { n.sameAs = p; return n }
func (n node) mt(t time.Time) node       { n.mtime = t; return n }
func (n node) anyMode() node             { n.noMode = true; return n }
func (n node) ownedBy(uid, gid int) node { n.uid, n.gid, n.owned = uid, gid, true; return n }
func (e *unpackEnv) abs(p string) string { return filepath.Join(e.root, filepath.FromSlash(e.rel(p))) }
func errText(err error) string           { return strings.ReplaceAll(err.Error(), "\n", " ") }
func hasAll(s string, subs []string) bool {
	return !slices.ContainsFunc(subs, func(x string) bool { return !strings.Contains(s, x) })
}

// checkTree asserts every node. With exact, it also asserts that root holds
// nothing but the nodes and their ancestors.
func (e *unpackEnv) checkTree(tb testing.TB, nodes []node, exact bool) {
	tb.Helper()
	allowed := map[string]bool{}
	for _, n := range nodes {
		p := e.rel(n.path)
		full := e.abs(n.path)
		fi, err := os.Lstat(full)
		if n.kind == 0 {
			if !errors.Is(err, fs.ErrNotExist) {
				tb.Errorf("%s: exists (%v), want absent", p, err)
			}
			continue
		}
		for q := p; q != ""; q = path.Dir(q) {
			allowed[q] = true
			if path.Dir(q) == "." {
				break
			}
		}
		if err != nil {
			tb.Errorf("%s: %v", p, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		switch n.kind {
		case 'f':
			if !fi.Mode().IsRegular() {
				tb.Errorf("%s: %s, want a regular file", p, fi.Mode())
				continue
			}
			if b, err := os.ReadFile(full); err != nil || string(b) != n.body {
				tb.Errorf("%s: content %q, %v; want %q", p, b, err, n.body)
			}
		case 'd':
			if !fi.IsDir() {
				tb.Errorf("%s: %s, want a directory", p, fi.Mode())
				continue
			}
		case 'l':
			if fi.Mode()&fs.ModeSymlink == 0 {
				tb.Errorf("%s: %s, want a symlink", p, fi.Mode())
				continue
			}
			if got, _ := os.Readlink(full); got != e.expand(n.target) {
				tb.Errorf("%s: symlink to %q, want %q", p, got, e.expand(n.target))
			}
		}
		if !n.noMode && st.Mode&0o7777 != n.mode {
			tb.Errorf("%s: mode %#o, want %#o", p, st.Mode&0o7777, n.mode)
		}
		if n.sameAs != "" {
			if fi2, err := os.Lstat(e.abs(n.sameAs)); err != nil || fi2.Sys().(*syscall.Stat_t).Ino != st.Ino {
				tb.Errorf("%s: not a hardlink of %s (%v)", p, n.sameAs, err)
			}
		}
		if !n.mtime.IsZero() && !fi.ModTime().Equal(n.mtime) {
			tb.Errorf("%s: mtime %v, want %v", p, fi.ModTime().UTC(), n.mtime.UTC())
		}
		if n.owned && os.Geteuid() == 0 && (int(st.Uid) != n.uid || int(st.Gid) != n.gid) {
			tb.Errorf("%s: owner %d:%d, want %d:%d", p, st.Uid, st.Gid, n.uid, n.gid)
		}
	}
	if !exact {
		return
	}
	err := filepath.WalkDir(e.root, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		p, _ := filepath.Rel(e.root, full)
		if p = filepath.ToSlash(p); p != "." && !allowed[p] {
			tb.Errorf("%s: unexpected %s in the tree", p, d.Type())
		}
		return nil
	})
	if err != nil {
		tb.Errorf("walk %s: %v", e.root, err)
	}
}

// unpackCase applies layers to a fresh root and checks the outcome.
type unpackCase struct {
	name   string
	layers [][]tarEntry
	opts   *UnpackOptions
	// wantErr is the error kind the last layer must fail with (errdefs), nil
	// for success; wantLimit the What of a *LimitError instead.
	wantErr   error
	wantLimit string
	errHas    []string // texts the error must contain (tmpPH expanded)
	want      []node
	loose     bool     // the tree may hold more than want
	warns     []string // one warning containing each text, and no others
	rootOnly  bool
	check     func(t *testing.T, e *unpackEnv)
}

func runUnpackCases(t *testing.T, cases []unpackCase) {
	t.Helper()
	for _, c := range cases {
		for _, stored := range []bool{false, true} {
			name := c.name
			if stored {
				name += "/stored"
			}
			t.Run(name, func(t *testing.T) {
				runUnpackCase(t, c, stored)
			})
		}
	}
}

// runUnpackCase runs c with its layers applied as tar streams, or stored
// first (storeLayer) and applied from the store (ApplyStored): the same
// tree, errors and warnings either way.
func runUnpackCase(t *testing.T, c unpackCase, stored bool) {
	if c.rootOnly && os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	e := newUnpackEnv(t)
	e.stored = stored
	var layers [][]byte
	for _, l := range c.layers {
		if l == nil {
			layers = append(layers, nil) // a stream of 0 bytes
			continue
		}
		layers = append(layers, e.tar(t, l))
	}
	failed, err := e.applyAll(t, c.opts, layers)
	e.checkSentinel(t)
	checkUnpackErr(t, e, c, failed, err)
	e.checkTree(t, c.want, !c.loose)
	if len(e.warnings) != len(c.warns) {
		t.Errorf("warnings %q, want one for each of %q", e.warnings, c.warns)
	}
	for _, w := range c.warns {
		if !slices.ContainsFunc(e.warnings, func(s string) bool { return strings.Contains(s, w) }) {
			t.Errorf("no warning mentions %q in %q", w, e.warnings)
		}
	}
	if c.check != nil {
		c.check(t, e)
	}
}

func checkUnpackErr(t *testing.T, e *unpackEnv, c unpackCase, failed int, err error) {
	t.Helper()
	if c.wantErr == nil && c.wantLimit == "" && c.errHas == nil {
		if err != nil {
			t.Fatalf("layer %d: unexpected error: %v", failed, err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want %v %s %q", c.wantErr, c.wantLimit, c.errHas)
	}
	if failed != len(c.layers)-1 {
		t.Errorf("layer %d failed (%v), want the last layer (%d) to fail", failed, err, len(c.layers)-1)
	}
	if c.wantErr != nil && !errors.Is(err, c.wantErr) {
		t.Errorf("error %q is not %v", err, c.wantErr)
	}
	if c.wantLimit != "" {
		var le *LimitError
		if !errors.As(err, &le) || le.What != c.wantLimit {
			t.Errorf("error %q is not a LimitError on %s", err, c.wantLimit)
		} else if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("error %q does not match ErrResourceExhausted", err)
		}
	}
	var subs []string
	for _, s := range c.errHas {
		subs = append(subs, e.expand(s))
	}
	if !hasAll(errText(err), subs) {
		t.Errorf("error %q does not mention all of %q", err, subs)
	}
}

// Times used for mtime checks (USTAR keeps whole seconds).
var (
	t1 = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	t2 = time.Date(2002, 3, 4, 5, 6, 7, 0, time.UTC)
	t3 = time.Date(2003, 4, 5, 6, 7, 8, 0, time.UTC)
	t4 = time.Date(2004, 5, 6, 7, 8, 9, 0, time.UTC)
)

func layers(ls ...[]tarEntry) [][]tarEntry { return ls }
func ents(es ...tarEntry) []tarEntry       { return es }

func TestUnpackTree(t *testing.T) {
	runUnpackCases(t, []unpackCase{{
		name: "files dirs symlinks hardlinks",
		layers: layers(ents(
			dirEnt("etc/", 0o755),
			fileEnt("etc/passwd", "root:x:0:0\n", 0o644),
			symEnt("etc/link", "passwd"),
			symEnt("abs", "/etc/passwd"),
			symEnt("dangling", "nowhere/../../x"),
			linkEnt("etc/hard", "etc/passwd"),
			linkEnt("hard2", "/etc/passwd"),
			fileEnt("empty", "", 0o600),
		)),
		want: []node{
			wDir("etc", 0o755),
			wFile("etc/passwd", "root:x:0:0\n", 0o644),
			wSym("etc/link", "passwd"),
			wSym("abs", "/etc/passwd"),
			wSym("dangling", "nowhere/../../x"),
			wFile("etc/hard", "root:x:0:0\n", 0o644).sameInode("etc/passwd"),
			wFile("hard2", "root:x:0:0\n", 0o644).sameInode("etc/passwd"),
			wFile("empty", "", 0o600),
		},
	}, {
		name: "special modes",
		layers: layers(ents(
			fileEnt("suid", "x", 0o4755),
			fileEnt("sgid", "x", 0o2755),
			fileEnt("ro", "x", 0o400),
			dirEnt("sgiddir/", 0o2755),
			dirEnt("tmp/", 0o1777),
			dirEnt("private/", 0o700),
			fileEnt("tmp/f", "x", 0o644),
		)),
		want: []node{
			wFile("suid", "x", 0o4755),
			wFile("sgid", "x", 0o2755),
			wFile("ro", "x", 0o400),
			wDir("sgiddir", 0o2755),
			wDir("tmp", 0o1777),
			wDir("private", 0o700),
			wFile("tmp/f", "x", 0o644),
		},
	}, {
		name: "mtimes of files symlinks and directories",
		layers: layers(ents(
			fileEnt("f", "x", 0o644).at(t1),
			symEnt("s", "f").at(t2),
			dirEnt("d/", 0o755).at(t3),
			fileEnt("d/child", "x", 0o644).at(t1),
			dirEnt("d/sub/", 0o755).at(t4),
			fileEnt("d/sub/x", "x", 0o644).at(t2),
			symEnt("d/sub/l", "x").at(t1),
			// A directory header after its children.
			fileEnt("late/x", "x", 0o644).at(t1),
			dirEnt("late/", 0o711).at(t2),
		)),
		want: []node{
			wFile("f", "x", 0o644).mt(t1),
			wSym("s", "f").mt(t2),
			wDir("d", 0o755).mt(t3),
			wFile("d/child", "x", 0o644).mt(t1),
			wDir("d/sub", 0o755).mt(t4),
			wFile("d/sub/x", "x", 0o644).mt(t2),
			wSym("d/sub/l", "x").mt(t1),
			wFile("late/x", "x", 0o644).mt(t1),
			wDir("late", 0o711).mt(t2),
		},
	}, {
		name: "directory mtime survives later entries of its layer",
		layers: layers(
			ents(fileEnt("d/old", "x", 0o644)),
			ents(dirEnt("d/", 0o755).at(t3), whEnt("d/.wh.old"), fileEnt("d/new", "x", 0o644), symEnt("d/l", "new")),
		),
		want: []node{wDir("d", 0o755).mt(t3), wGone("d/old"), wFile("d/new", "x", 0o644), wSym("d/l", "new")},
	}, {
		// Times past 2262 do not fit in int64 nanoseconds: they must not wrap
		// around to the 1900s. The expected times are what the file system
		// stores for them (ext4 stops in 2446).
		name: "times out of range are clamped",
		layers: layers(ents(
			fileEnt("future", "x", 0o644).at(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)),
			fileEnt("y2300", "x", 0o644).at(y2300),
			symEnt("l2300", "x").at(y2300),
			dirEnt("d2300/", 0o755).at(y2300),
			fileEnt("past", "x", 0o644).at(time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)),
		)),
		want: []node{
			wFile("future", "x", 0o644).mt(storedTime(t, maxTime)),
			wFile("y2300", "x", 0o644).mt(storedTime(t, y2300)),
			wSym("l2300", "x").mt(storedTime(t, y2300)),
			wDir("d2300", 0o755).mt(storedTime(t, y2300)),
			wFile("past", "x", 0o644).mt(minTime),
		},
	}, {
		name:   "missing parents are created",
		layers: layers(ents(fileEnt("a/b/c/d", "x", 0o644), symEnt("l/m/n", "x"))),
		want: []node{
			wDir("a", implicitDirMode), wDir("a/b", implicitDirMode), wDir("a/b/c", implicitDirMode),
			wFile("a/b/c/d", "x", 0o644), wDir("l/m", implicitDirMode), wSym("l/m/n", "x"),
		},
	}, {
		name:   "names are cleaned",
		layers: layers(ents(fileEnt("./x/./y//z", "1", 0o644), fileEnt("x/../w", "2", 0o644), dirEnt("./v/", 0o750))),
		want:   []node{wDir("x", implicitDirMode), wDir("x/y", implicitDirMode), wFile("x/y/z", "1", 0o644), wFile("w", "2", 0o644), wDir("v", 0o750)},
	}, {
		name: "later layer modifies and adds",
		layers: layers(
			ents(dirEnt("etc/", 0o755), fileEnt("etc/conf", "v1", 0o644), fileEnt("etc/keep", "k", 0o644)),
			ents(fileEnt("etc/conf", "v2", 0o600), fileEnt("etc/new", "n", 0o644)),
			ents(linkEnt("etc/hard", "etc/keep")),
		),
		want: []node{
			wDir("etc", 0o755), wFile("etc/conf", "v2", 0o600), wFile("etc/keep", "k", 0o644).sameInode("etc/hard"),
			wFile("etc/new", "n", 0o644), wFile("etc/hard", "k", 0o644),
		},
	}, {
		name:   "empty layer",
		layers: layers(ents(fileEnt("x", "x", 0o644)), ents()),
		want:   []node{wFile("x", "x", 0o644)},
	}, {
		name:   "hardlink to a symlink links the symlink itself",
		layers: layers(ents(fileEnt("target", "t", 0o644), symEnt("s", "target"), linkEnt("h", "s"))),
		want:   []node{wFile("target", "t", 0o644), wSym("s", "target"), wSym("h", "target").sameInode("s")},
	}, {
		name:   "pax global headers are ignored",
		layers: layers(ents(tarEntry{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "global", PAXRecords: map[string]string{"comment": "x"}}}, fileEnt("x", "x", 0o644))),
		want:   []node{wFile("x", "x", 0o644)},
	}, {
		name:     "directory made read-only by one layer is filled by the next",
		rootOnly: true,
		layers: layers(
			ents(dirEnt("ro/", 0o555), fileEnt("ro/a", "a", 0o444)),
			ents(fileEnt("ro/b", "b", 0o444), whEnt("ro/.wh.a")),
		),
		want: []node{wDir("ro", 0o555), wFile("ro/b", "b", 0o444), wGone("ro/a")},
	}, {
		name:     "owners are applied before modes",
		rootOnly: true,
		layers: layers(ents(
			dirEnt("d/", 0o2775).owner(1234, 5678),
			fileEnt("d/suid", "x", 0o4755).owner(1234, 5678),
			fileEnt("sgid", "x", 0o2755).owner(42, 43),
			symEnt("l", "d").owner(7, 8),
		)),
		want: []node{
			wDir("d", 0o2775).ownedBy(1234, 5678),
			wFile("d/suid", "x", 0o4755).ownedBy(1234, 5678),
			wFile("sgid", "x", 0o2755).ownedBy(42, 43),
			wSym("l", "d").ownedBy(7, 8),
		},
	}, {
		name:     "IgnoreOwner keeps the caller as owner",
		rootOnly: true,
		opts:     &UnpackOptions{IgnoreOwner: true},
		layers:   layers(ents(dirEnt("d/", 0o755).owner(1234, 5678), fileEnt("d/f", "x", 0o4755).owner(1234, 5678), symEnt("l", "d").owner(7, 8))),
		want: []node{
			wDir("d", 0o755).ownedBy(0, 0), wFile("d/f", "x", 0o4755).ownedBy(0, 0), wSym("l", "d").ownedBy(0, 0),
		},
	}})
}

// TestUnpackConfined checks that names, symlinks and hardlinks that point
// out of the tree land inside it or are refused, and never touch the host.
func TestUnpackConfined(t *testing.T) {
	const evilAbs = tmpPH + "/outside" // the real host directory, as an absolute symlink target
	runUnpackCases(t, []unpackCase{{
		name:   "absolute name",
		layers: layers(ents(fileEnt("/etc/x", "abs", 0o644), dirEnt("/abs/dir/", 0o700))),
		want:   []node{wDir("etc", implicitDirMode), wFile("etc/x", "abs", 0o644), wDir("abs", implicitDirMode), wDir("abs/dir", 0o700)},
	}, {
		// "../outside/secret", joined naively to ROOT, is the host's
		// TMP/outside/secret; cleaned against the root it is
		// ROOT/outside/secret, as is "../../outside/secret".
		name:   "climbing name lands in root",
		layers: layers(ents(fileEnt("../outside/secret", "pwned", 0o777), fileEnt("../../outside/secret2", "pwned", 0o777))),
		want:   []node{wDir("outside", implicitDirMode), wFile("outside/secret", "pwned", 0o777), wFile("outside/secret2", "pwned", 0o777)},
	}, {
		// "a/../../x" cleans to "x".
		name:   "climbing in the middle of a name",
		layers: layers(ents(fileEnt("a/../../x", "x", 0o644), symEnt("b/../../../y", "/"), dirEnt("/../../../z/", 0o700))),
		want:   []node{wFile("x", "x", 0o644), wSym("y", "/"), wDir("z", 0o700)},
	}, {
		name:   "climbing directory entry does not chmod the host directory",
		layers: layers(ents(dirEnt("../outside/", 0o777).at(t1), dirEnt("../../outside/", 0o700), dirEnt("../", 0o750))),
		want:   []node{wDir("outside", 0o700), wDir("", 0o750)},
	}, {
		name:   "entry named after the host path lands in root",
		layers: layers(ents(fileEnt(tmpPH+"/outside/secret", "pwned", 0o644))),
		want:   []node{wFile(tmpPH+"/outside/secret", "pwned", 0o644).anyMode()},
		loose:  true,
	}, {
		name:   "absolute symlink to the host directory, write in the same layer",
		layers: layers(ents(dirEnt(tmpPH+"/outside/", 0o755), symEnt("evil", evilAbs), fileEnt("evil/secret", "pwned", 0o644))),
		want:   []node{wSym("evil", evilAbs), wDir(tmpPH+"/outside", 0o755), wFile(tmpPH+"/outside/secret", "pwned", 0o644)},
		loose:  true, // the implicit parents of TMP inside root
	}, {
		name: "absolute symlink to the host directory, write in a later layer",
		layers: layers(
			ents(dirEnt(tmpPH+"/outside/", 0o755), symEnt("evil", evilAbs)),
			ents(fileEnt("evil/secret", "pwned", 0o600), dirEnt("evil/sub/", 0o700), fileEnt("evil/sub/x", "x", 0o644)),
		),
		want: []node{
			wSym("evil", evilAbs), wFile(tmpPH+"/outside/secret", "pwned", 0o600),
			wDir(tmpPH+"/outside/sub", 0o700), wFile(tmpPH+"/outside/sub/x", "x", 0o644),
		},
		loose: true,
	}, {
		// The symlink's target does not exist inside root: the unpacker
		// refuses the entry rather than creating ROOT/TMP/outside as
		// containerd would. Either is safe; this pins the current behaviour.
		name:    "absolute symlink to the host directory, dangling inside root",
		layers:  layers(ents(symEnt("evil", evilAbs)), ents(fileEnt("evil/secret", "pwned", 0o644))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"evil/secret"`, "not a directory"},
		want:    []node{wSym("evil", evilAbs)},
	}, {
		name:   "symlink to / in the same layer",
		layers: layers(ents(symEnt("evil", "/"), fileEnt("evil/secret", "pwned", 0o644), dirEnt("evil/etc/", 0o700))),
		want:   []node{wSym("evil", "/"), wFile("secret", "pwned", 0o644), wDir("etc", 0o700)},
	}, {
		name:   "symlink to / in a later layer",
		layers: layers(ents(symEnt("evil", "/")), ents(fileEnt("evil/secret", "pwned", 0o644)), ents(fileEnt("evil/evil/evil/x", "x", 0o644))),
		want:   []node{wSym("evil", "/"), wFile("secret", "pwned", 0o644), wFile("x", "x", 0o644)},
	}, {
		// On the host, ROOT/evil -> "../outside" is TMP/outside; inside the
		// root it is ROOT/outside, as is "../../outside".
		name: "relative symlink climbing out, same layer",
		layers: layers(ents(
			dirEnt("outside/", 0o755), symEnt("evil", "../outside"), fileEnt("evil/secret", "pwned", 0o644),
			symEnt("evil2", "../../outside"), fileEnt("evil2/secret2", "pwned", 0o644),
		)),
		want: []node{
			wDir("outside", 0o755), wSym("evil", "../outside"), wFile("outside/secret", "pwned", 0o644),
			wSym("evil2", "../../outside"), wFile("outside/secret2", "pwned", 0o644),
		},
	}, {
		name: "relative symlink climbing out, later layer",
		layers: layers(
			ents(dirEnt("outside/", 0o755), dirEnt("a/b/", 0o755), symEnt("a/b/evil", "../../../outside")),
			ents(fileEnt("a/b/evil/secret", "pwned", 0o644)),
		),
		want: []node{
			wDir("outside", 0o755), wDir("a", implicitDirMode), wDir("a/b", 0o755),
			wSym("a/b/evil", "../../../outside"), wFile("outside/secret", "pwned", 0o644),
		},
	}, {
		name:    "relative symlink climbing out, dangling inside root",
		layers:  layers(ents(symEnt("evil", "../outside")), ents(fileEnt("evil/secret", "pwned", 0o644))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"evil/secret"`},
		want:    []node{wSym("evil", "../outside")},
	}, {
		name:   "chain of symlinks",
		layers: layers(ents(dirEnt("outside/", 0o755), symEnt("a", "b"), symEnt("b", "c/../../outside"), dirEnt("c/", 0o755), fileEnt("a/secret", "pwned", 0o644))),
		want: []node{
			wDir("outside", 0o755), wSym("a", "b"), wSym("b", "c/../../outside"), wDir("c", 0o755),
			wFile("outside/secret", "pwned", 0o644),
		},
	}, {
		name:   "symlink loop as a parent",
		layers: layers(ents(symEnt("a", "b"), symEnt("b", "/a")), ents(fileEnt("a/x", "x", 0o644))),
		errHas: []string{`"a/x"`, "symbolic links"},
		want:   []node{wSym("a", "b"), wSym("b", "/a")},
	}, {
		name: "directory replaced by an absolute symlink, written in a third layer",
		layers: layers(
			ents(dirEnt("d/", 0o755), fileEnt("d/old", "old", 0o644), dirEnt(tmpPH+"/outside/", 0o755)),
			ents(symEnt("d", evilAbs)),
			ents(fileEnt("d/secret", "pwned", 0o644), dirEnt("d/sub/", 0o700), fileEnt("d/sub/x", "x", 0o644)),
		),
		want: []node{
			wSym("d", evilAbs), wGone("d/old"), wFile(tmpPH+"/outside/secret", "pwned", 0o644),
			wDir(tmpPH+"/outside/sub", 0o700), wFile(tmpPH+"/outside/sub/x", "x", 0o644),
		},
		loose: true,
	}, {
		name: "directory replaced by a symlink to /, written in a third layer",
		layers: layers(
			ents(dirEnt("d/", 0o755), fileEnt("d/old", "old", 0o644)),
			ents(symEnt("d", "/")),
			ents(fileEnt("d/secret", "pwned", 0o644)),
		),
		want: []node{wSym("d", "/"), wFile("secret", "pwned", 0o644)},
	}, {
		name: "directory replaced by a relative climbing symlink, written in a third layer",
		layers: layers(
			ents(dirEnt("d/", 0o755), fileEnt("d/old", "old", 0o644), dirEnt("outside/", 0o755)),
			ents(symEnt("d", "../outside")),
			ents(fileEnt("d/secret", "pwned", 0o644)),
		),
		want: []node{wSym("d", "../outside"), wDir("outside", 0o755), wFile("outside/secret", "pwned", 0o644)},
	}, {
		name: "directory replaced by a dangling climbing symlink, written in a third layer",
		layers: layers(
			ents(dirEnt("d/", 0o755), fileEnt("d/old", "old", 0o644)),
			ents(symEnt("d", "../outside")),
			ents(fileEnt("d/secret", "pwned", 0o644)),
		),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"d/secret"`},
		want:    []node{wSym("d", "../outside")},
	}, {
		name:   "file over a symlink to the host file",
		layers: layers(ents(symEnt("s", tmpPH+"/outside/secret")), ents(fileEnt("s", "pwned", 0o777).at(t1))),
		want:   []node{wFile("s", "pwned", 0o777).mt(t1)},
	}, {
		name:   "symlink with mtime to the host file",
		layers: layers(ents(symEnt("s", tmpPH+"/outside/secret").at(t1), symEnt("d", evilAbs).at(t2))),
		want:   []node{wSym("s", tmpPH+"/outside/secret").mt(t1), wSym("d", evilAbs).mt(t2)},
	}, {
		// CVE-2021-32760: a hardlink to a symlink to a host file, then a
		// chmod of the hardlink.
		name: "directory entry over a hardlinked symlink to the host file",
		layers: layers(
			ents(symEnt("s", tmpPH+"/outside/secret"), linkEnt("h", "s")),
			ents(dirEnt("s/", 0o777).at(t1)),
		),
		want: []node{wDir("s", 0o777).mt(t1), wSym("h", tmpPH+"/outside/secret")},
	}, {
		name: "file entry over a hardlink of a symlink to the host file",
		layers: layers(
			ents(symEnt("s", tmpPH+"/outside/secret"), linkEnt("h", "s"), linkEnt("h2", "h")),
			ents(fileEnt("h", "x", 0o4777).at(t1)),
		),
		want: []node{wSym("s", tmpPH+"/outside/secret").sameInode("h2"), wSym("h2", tmpPH+"/outside/secret"), wFile("h", "x", 0o4777).mt(t1)},
	}, {
		name: "same layer: hardlink of a symlink to the host file, then a directory entry for it",
		layers: layers(ents(
			symEnt("s", tmpPH+"/outside/secret"), linkEnt("h", "s"), dirEnt("h/", 0o777).at(t1), fileEnt("s", "x", 0o777),
		)),
		want: []node{wDir("h", 0o777).mt(t1), wFile("s", "x", 0o777)},
	}, {
		// The directory header's mode and times are applied at the end of
		// the layer; by then the path is a symlink to the host directory.
		name:   "directory header then a symlink to the host directory in the same layer",
		layers: layers(ents(dirEnt("d/", 0o777).at(t1), symEnt("d", evilAbs))),
		want:   []node{wSym("d", evilAbs)},
	}, {
		name:   "directory header then a symlink to / in the same layer",
		layers: layers(ents(dirEnt("d/", 0o777).at(t1), symEnt("d", "/"))),
		want:   []node{wSym("d", "/"), wDir("", 0o755)},
	}, {
		name:   "directory header then a symlink to the host file in the same layer",
		layers: layers(ents(dirEnt("d/", 0o777).at(t1), symEnt("d", tmpPH+"/outside/secret"))),
		want:   []node{wSym("d", tmpPH+"/outside/secret")},
	}, {
		name:    "hardlink through a symlinked parent to the host directory",
		layers:  layers(ents(symEnt("evil", evilAbs)), ents(linkEnt("h", "evil/secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "does not exist"},
		want:    []node{wSym("evil", evilAbs)},
	}, {
		name:    "hardlink through a relative climbing symlinked parent",
		layers:  layers(ents(symEnt("evil", "../outside"), linkEnt("h", "evil/secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "does not exist"},
		want:    []node{wSym("evil", "../outside")},
	}, {
		name:    "hardlink to the host file by absolute path",
		layers:  layers(ents(linkEnt("h", tmpPH+"/outside/secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "does not exist"},
	}, {
		name:   "hardlink through a symlinked parent to / links inside root",
		layers: layers(ents(fileEnt("secret", "inner", 0o644), symEnt("evil", "/")), ents(linkEnt("h", "evil/secret"))),
		want:   []node{wFile("secret", "inner", 0o644), wSym("evil", "/"), wFile("h", "inner", 0o644).sameInode("secret")},
	}, {
		name: "hardlink through a symlinked parent to the host path links inside root",
		layers: layers(
			ents(fileEnt(tmpPH+"/outside/secret", "inner", 0o644), symEnt("evil", evilAbs)),
			ents(linkEnt("h", "evil/secret")),
		),
		want:  []node{wSym("evil", evilAbs), wFile("h", "inner", 0o644).sameInode(tmpPH + "/outside/secret")},
		loose: true,
	}, {
		name:    "whiteout climbing out",
		layers:  layers(ents(fileEnt("x", "x", 0o644)), ents(whEnt("../../outside/.wh.secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"../../outside/.wh.secret", "climbs out"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "whiteout climbing out one level",
		layers:  layers(ents(fileEnt("x", "x", 0o644)), ents(whEnt("../outside/.wh.secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"climbs out"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "whiteout climbing out from a subdirectory",
		layers:  layers(ents(fileEnt("a/x", "x", 0o644)), ents(whEnt("a/../../outside/.wh.secret"), whEnt("a/../../../outside/.wh.secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"climbs out"},
		want:    []node{wFile("a/x", "x", 0o644)},
	}, {
		name:    "absolute whiteout climbing out",
		layers:  layers(ents(fileEnt("x", "x", 0o644)), ents(whEnt("/../outside/.wh..wh..opq"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"climbs out"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:   "whiteout through a symlinked parent to the host directory",
		layers: layers(ents(symEnt("evil", evilAbs)), ents(whEnt("evil/.wh.secret"))),
		want:   []node{wSym("evil", evilAbs)},
	}, {
		name:   "whiteout through a relative climbing symlinked parent",
		layers: layers(ents(symEnt("evil", "../outside"), symEnt("evil2", "../../outside")), ents(whEnt("evil/.wh.secret"), whEnt("evil2/.wh.secret"))),
		want:   []node{wSym("evil", "../outside"), wSym("evil2", "../../outside")},
	}, {
		name: "whiteout through a symlinked parent removes the copy inside root",
		layers: layers(
			ents(fileEnt(tmpPH+"/outside/secret", "inner", 0o644), fileEnt(tmpPH+"/outside/other", "o", 0o644), symEnt("evil", evilAbs)),
			ents(whEnt("evil/.wh.secret")),
		),
		want:  []node{wSym("evil", evilAbs), wGone(tmpPH + "/outside/secret"), wFile(tmpPH+"/outside/other", "o", 0o644)},
		loose: true,
	}, {
		name:   "opaque marker through a symlinked parent to the host directory",
		layers: layers(ents(symEnt("evil", evilAbs), symEnt("rel", "../outside")), ents(whEnt("evil/.wh..wh..opq"), whEnt("rel/.wh..wh..opq"))),
		want:   []node{wSym("evil", evilAbs), wSym("rel", "../outside")},
	}, {
		name:   "whiteout of a symlink to the host directory removes the symlink",
		layers: layers(ents(symEnt("evil", evilAbs), symEnt("file", tmpPH+"/outside/secret")), ents(whEnt(".wh.evil"), whEnt(".wh.file"))),
		want:   []node{wGone("evil"), wGone("file")},
	}, {
		name: "opaque marker removes symlinks without following them",
		layers: layers(
			ents(dirEnt("d/", 0o755), symEnt("d/l", evilAbs), symEnt("d/s", tmpPH+"/outside/secret"), symEnt("d/r", "../../outside")),
			ents(whEnt("d/.wh..wh..opq")),
		),
		want: []node{wDir("d", 0o755), wGone("d/l"), wGone("d/s"), wGone("d/r")},
	}, {
		name:   "file over a symlink to the host directory replaces the symlink",
		layers: layers(ents(symEnt("d", evilAbs)), ents(fileEnt("d", "x", 0o644))),
		want:   []node{wFile("d", "x", 0o644)},
	}})
}

func TestUnpackHardlinks(t *testing.T) {
	runUnpackCases(t, []unpackCase{{
		name:    "missing target",
		layers:  layers(ents(linkEnt("h", "nowhere"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "nowhere", "does not exist"},
	}, {
		name:    "target in a missing directory",
		layers:  layers(ents(linkEnt("h", "no/where"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "does not exist"},
	}, {
		name:    "target under a file",
		layers:  layers(ents(fileEnt("f", "x", 0o644), linkEnt("h", "f/x"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "does not exist"},
		want:    []node{wFile("f", "x", 0o644)},
	}, {
		name:    "target climbing out",
		layers:  layers(ents(fileEnt("x", "x", 0o644), linkEnt("h", "../../x"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "outside the image"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "target climbing out one level",
		layers:  layers(ents(fileEnt("x", "x", 0o644), linkEnt("h", "../outside/secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "outside the image"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "target climbing out in the middle",
		layers:  layers(ents(fileEnt("x", "x", 0o644), linkEnt("h", "a/../../x"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "outside the image"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "absolute target climbing out",
		layers:  layers(ents(fileEnt("x", "x", 0o644), linkEnt("h", "/../outside/secret"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "outside the image"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "target is itself",
		layers:  layers(ents(fileEnt("h", "x", 0o644)), ents(linkEnt("h", "./h"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "itself"},
		want:    []node{wFile("h", "x", 0o644)},
	}, {
		name:    "target is a directory",
		layers:  layers(ents(dirEnt("d/", 0o755), linkEnt("h", "d"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "directory"},
		// A failed layer leaves its directories' metadata unapplied.
		want: []node{wDir("d", 0).anyMode()},
	}, {
		name:    "target is the root",
		layers:  layers(ents(linkEnt("h", "./"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "root"},
	}, {
		name:    "target is /",
		layers:  layers(ents(linkEnt("h", "/"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`},
	}, {
		name:    "empty target",
		layers:  layers(ents(linkEnt("h", ""))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`, "empty target"},
	}, {
		name:    "target is an ancestor removed by the replacement",
		layers:  layers(ents(fileEnt("a/b", "x", 0o644)), ents(linkEnt("a", "a/b"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"a"`, "does not exist"},
	}, {
		name:   "absolute target and lower-layer target",
		layers: layers(ents(fileEnt("bin/busybox", "bb", 0o755)), ents(linkEnt("bin/sh", "/bin/busybox"), linkEnt("/bin/ls", "./bin/busybox"))),
		want: []node{
			wDir("bin", implicitDirMode), wFile("bin/busybox", "bb", 0o755),
			wFile("bin/sh", "bb", 0o755).sameInode("bin/busybox"), wFile("bin/ls", "bb", 0o755).sameInode("bin/busybox"),
		},
	}, {
		name:   "hardlink replaces an existing file and directory",
		layers: layers(ents(fileEnt("t", "t", 0o644), fileEnt("f", "old", 0o644), fileEnt("d/x", "x", 0o644)), ents(linkEnt("f", "t"), linkEnt("d", "t"))),
		want:   []node{wFile("t", "t", 0o644), wFile("f", "t", 0o644).sameInode("t"), wFile("d", "t", 0o644).sameInode("t")},
	}, {
		name:   "file rewritten after being hardlinked keeps the old link",
		layers: layers(ents(fileEnt("a", "1", 0o644), linkEnt("b", "a"), fileEnt("a", "2", 0o600))),
		want:   []node{wFile("a", "2", 0o600), wFile("b", "1", 0o644)},
	}})
}

func TestUnpackWhiteouts(t *testing.T) {
	runUnpackCases(t, []unpackCase{{
		name:   "removes a lower file",
		layers: layers(ents(fileEnt("x", "x", 0o644), fileEnt("y", "y", 0o644)), ents(whEnt(".wh.x"))),
		want:   []node{wGone("x"), wFile("y", "y", 0o644)},
	}, {
		name: "removes a lower directory tree",
		layers: layers(
			ents(dirEnt("d/", 0o755), dirEnt("d/sub/", 0o700), fileEnt("d/sub/f", "f", 0o644), symEnt("d/l", "/"), fileEnt("keep/x", "x", 0o644)),
			ents(whEnt(".wh.d")),
		),
		want: []node{wGone("d"), wDir("keep", implicitDirMode), wFile("keep/x", "x", 0o644)},
	}, {
		name:   "removes a nested lower entry",
		layers: layers(ents(fileEnt("a/b/c", "c", 0o644), fileEnt("a/b/d", "d", 0o644)), ents(whEnt("a/b/.wh.c"))),
		want:   []node{wDir("a", implicitDirMode), wDir("a/b", implicitDirMode), wGone("a/b/c"), wFile("a/b/d", "d", 0o644)},
	}, {
		name:   "removes one name of a hardlinked file",
		layers: layers(ents(fileEnt("a", "x", 0o644), linkEnt("b", "a")), ents(whEnt(".wh.a"))),
		want:   []node{wGone("a"), wFile("b", "x", 0o644)},
	}, {
		name:   "missing path is a no-op",
		layers: layers(ents(fileEnt("x", "x", 0o644)), ents(whEnt(".wh.nothing"), whEnt("no/dir/.wh.x"), whEnt("x/.wh.y"))),
		want:   []node{wFile("x", "x", 0o644)},
	}, {
		name:   "does not remove an entry of its own layer",
		layers: layers(ents(fileEnt("x", "x", 0o644), whEnt(".wh.x"), fileEnt("d/f", "f", 0o644), whEnt(".wh.d"), whEnt("d/.wh.f"))),
		want:   []node{wFile("x", "x", 0o644), wDir("d", implicitDirMode), wFile("d/f", "f", 0o644)},
	}, {
		name:   "lower file replaced in the same layer, whiteout after",
		layers: layers(ents(fileEnt("x", "old", 0o644)), ents(fileEnt("x", "new", 0o644), whEnt(".wh.x"))),
		want:   []node{wFile("x", "new", 0o644)},
	}, {
		name:   "lower file replaced in the same layer, whiteout before",
		layers: layers(ents(fileEnt("x", "old", 0o644)), ents(whEnt(".wh.x"), fileEnt("x", "new", 0o644))),
		want:   []node{wFile("x", "new", 0o644)},
	}, {
		// The whiteout deletes the lower directory, the layer recreates it
		// with one file: whatever the order of the two entries, only the
		// new file is left.
		name:   "lower directory whited out and recreated, whiteout first",
		layers: layers(ents(fileEnt("d/old", "old", 0o644)), ents(whEnt(".wh.d"), fileEnt("d/new", "new", 0o644))),
		want:   []node{wDir("d", implicitDirMode), wFile("d/new", "new", 0o644), wGone("d/old")},
	}, {
		name:   "lower directory whited out and recreated, whiteout last",
		layers: layers(ents(fileEnt("d/old", "old", 0o644)), ents(fileEnt("d/new", "new", 0o644), whEnt(".wh.d"))),
		want:   []node{wDir("d", implicitDirMode), wFile("d/new", "new", 0o644), wGone("d/old")},
	}, {
		name:    "empty whiteout name",
		layers:  layers(ents(fileEnt("x", "x", 0o644)), ents(whEnt(".wh."))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`".wh."`, "invalid whiteout"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "empty whiteout name in a directory",
		layers:  layers(ents(fileEnt("d/x", "x", 0o644)), ents(whEnt("d/.wh."))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"d/.wh."`, "invalid whiteout"},
		want:    []node{wFile("d/x", "x", 0o644)},
	}, {
		name:    "whiteout of dot",
		layers:  layers(ents(fileEnt("d/x", "x", 0o644)), ents(whEnt("d/.wh.."))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"invalid whiteout"},
		want:    []node{wFile("d/x", "x", 0o644)},
	}, {
		name:    "whiteout of dot dot",
		layers:  layers(ents(fileEnt("d/x", "x", 0o644)), ents(whEnt("d/.wh..."))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"invalid whiteout"},
		want:    []node{wFile("d/x", "x", 0o644)},
	}, {
		name:   "whiteout entries of other types are whiteouts too",
		layers: layers(ents(fileEnt("x", "x", 0o644), fileEnt("y", "y", 0o644)), ents(dirEnt(".wh.x/", 0o755), symEnt(".wh.y", "z"))),
		want:   []node{wGone("x"), wGone("y"), wGone(".wh.x"), wGone(".wh.y")},
	}, {
		name:   "aufs metadata is ignored with a warning",
		layers: layers(ents(fileEnt("x", "x", 0o644)), ents(whEnt(".wh..wh.aufs"), dirEnt(".wh..wh.plnk/", 0o700))),
		want:   []node{wFile("x", "x", 0o644)},
		warns:  []string{".wh..wh.aufs", ".wh..wh.plnk"},
	}})
}

func TestUnpackOpaque(t *testing.T) {
	lower := ents(
		dirEnt("d/", 0o755), fileEnt("d/a", "a", 0o644), dirEnt("d/sub/", 0o755), fileEnt("d/sub/deep", "deep", 0o644),
		symEnt("d/l", "a"), fileEnt("other/x", "x", 0o644),
	)
	runUnpackCases(t, []unpackCase{{
		name:   "hides lower entries, nested directories included",
		layers: layers(lower, ents(whEnt("d/.wh..wh..opq"))),
		want: []node{
			wDir("d", 0o755), wGone("d/a"), wGone("d/sub"), wGone("d/l"),
			wDir("other", implicitDirMode), wFile("other/x", "x", 0o644),
		},
	}, {
		name:   "marker before this layer's entries",
		layers: layers(lower, ents(dirEnt("d/", 0o700), whEnt("d/.wh..wh..opq"), fileEnt("d/new", "n", 0o644), fileEnt("d/sub/new", "n", 0o644))),
		want: []node{
			wDir("d", 0o700), wGone("d/a"), wGone("d/l"), wFile("d/new", "n", 0o644),
			wDir("d/sub", implicitDirMode), wFile("d/sub/new", "n", 0o644), wGone("d/sub/deep"),
			wDir("other", implicitDirMode), wFile("other/x", "x", 0o644),
		},
	}, {
		name:   "marker after this layer's entries",
		layers: layers(lower, ents(dirEnt("d/", 0o700), fileEnt("d/new", "n", 0o644), fileEnt("d/sub/new", "n", 0o644), whEnt("d/.wh..wh..opq"))),
		want: []node{
			wDir("d", 0o700), wGone("d/a"), wGone("d/l"), wFile("d/new", "n", 0o644),
			wDir("d/sub", 0o755), wFile("d/sub/new", "n", 0o644), wGone("d/sub/deep"),
			wDir("other", implicitDirMode), wFile("other/x", "x", 0o644),
		},
	}, {
		name:   "marker after this layer's replacement of a lower entry",
		layers: layers(lower, ents(fileEnt("d/a", "new a", 0o600), whEnt("d/.wh..wh..opq"))),
		want: []node{
			wDir("d", 0o755), wFile("d/a", "new a", 0o600), wGone("d/sub"), wGone("d/l"),
			wDir("other", implicitDirMode), wFile("other/x", "x", 0o644),
		},
	}, {
		name:   "marker at the root",
		layers: layers(lower, ents(fileEnt("new", "n", 0o644), whEnt(".wh..wh..opq"), fileEnt("other/y", "y", 0o644))),
		want:   []node{wFile("new", "n", 0o644), wGone("d"), wDir("other", implicitDirMode), wFile("other/y", "y", 0o644), wGone("other/x")},
	}, {
		name:   "marker for a missing directory is a no-op",
		layers: layers(lower, ents(whEnt("nothing/.wh..wh..opq"), whEnt("d/a/.wh..wh..opq"))),
		want: []node{
			wDir("d", 0o755), wFile("d/a", "a", 0o644), wDir("d/sub", 0o755), wFile("d/sub/deep", "deep", 0o644),
			wSym("d/l", "a"), wDir("other", implicitDirMode), wFile("other/x", "x", 0o644),
		},
	}, {
		name:   "marker does not hide entries of its own layer",
		layers: layers(ents(fileEnt("d/a", "a", 0o644), whEnt("d/.wh..wh..opq"), fileEnt("d/b", "b", 0o644))),
		want:   []node{wDir("d", implicitDirMode), wFile("d/a", "a", 0o644), wFile("d/b", "b", 0o644)},
	}})
}

func TestUnpackTypeChanges(t *testing.T) {
	runUnpackCases(t, []unpackCase{{
		name:   "file over directory",
		layers: layers(ents(dirEnt("p/", 0o755), fileEnt("p/child", "c", 0o644), dirEnt("p/sub/", 0o755)), ents(fileEnt("p", "file", 0o600))),
		want:   []node{wFile("p", "file", 0o600)},
	}, {
		name:   "directory over file",
		layers: layers(ents(fileEnt("p", "file", 0o644)), ents(dirEnt("p/", 0o750), fileEnt("p/child", "c", 0o644))),
		want:   []node{wDir("p", 0o750), wFile("p/child", "c", 0o644)},
	}, {
		name:   "directory over symlink replaces the symlink, not its target",
		layers: layers(ents(dirEnt("t/", 0o755), fileEnt("t/f", "f", 0o644), symEnt("p", "t")), ents(dirEnt("p/", 0o700), fileEnt("p/new", "n", 0o644))),
		want:   []node{wDir("t", 0o755), wFile("t/f", "f", 0o644), wDir("p", 0o700), wFile("p/new", "n", 0o644), wGone("t/new")},
	}, {
		name:   "symlink over directory",
		layers: layers(ents(dirEnt("p/", 0o755), fileEnt("p/child", "c", 0o644)), ents(symEnt("p", "elsewhere"))),
		want:   []node{wSym("p", "elsewhere")},
	}, {
		name:   "symlink over file over symlink",
		layers: layers(ents(symEnt("p", "a")), ents(fileEnt("p", "f", 0o644)), ents(symEnt("p", "b"))),
		want:   []node{wSym("p", "b")},
	}, {
		name: "same path twice in one layer, last wins",
		layers: layers(ents(
			fileEnt("f", "first", 0o644), fileEnt("f", "second", 0o600),
			fileEnt("g", "file", 0o644), symEnt("g", "link"),
			symEnt("h", "link"), dirEnt("h/", 0o711),
			dirEnt("i/", 0o700), dirEnt("i/", 0o755).at(t2),
			dirEnt("j/", 0o700).at(t1), fileEnt("j", "file", 0o644),
		)),
		want: []node{
			wFile("f", "second", 0o600), wSym("g", "link"), wDir("h", 0o711), wDir("i", 0o755).mt(t2), wFile("j", "file", 0o644),
		},
	}, {
		name: "directory over directory merges",
		layers: layers(
			ents(dirEnt("d/", 0o755).at(t1), fileEnt("d/a", "a", 0o644), dirEnt("d/sub/", 0o755), fileEnt("d/sub/x", "x", 0o644)),
			ents(dirEnt("d/", 0o700).at(t2), fileEnt("d/b", "b", 0o644), dirEnt("d/sub/", 0o750)),
		),
		want: []node{
			wDir("d", 0o700).mt(t2), wFile("d/a", "a", 0o644), wFile("d/b", "b", 0o644),
			wDir("d/sub", 0o750), wFile("d/sub/x", "x", 0o644),
		},
	}})
}

func TestUnpackRootEntry(t *testing.T) {
	runUnpackCases(t, []unpackCase{{
		name:   "dot sets the root's metadata",
		layers: layers(ents(dirEnt(".", 0o750).at(t1), fileEnt("x", "x", 0o644))),
		want:   []node{wDir("", 0o750).mt(t1), wFile("x", "x", 0o644)},
	}, {
		name:   "dot slash, slash and dot dot set the root's metadata",
		layers: layers(ents(dirEnt("./", 0o700)), ents(dirEnt("/", 0o711)), ents(dirEnt("../", 0o751).at(t2))),
		want:   []node{wDir("", 0o751).mt(t2)},
	}, {
		name:    "dot as a symlink",
		layers:  layers(ents(symEnt(".", "/"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"."`, "root"},
	}, {
		name:    "dot slash as a file",
		layers:  layers(ents(fileEnt("x", "x", 0o644), retyped(dirEnt("./", 0o644), tar.TypeReg))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"./"`, "root"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "dot as a hardlink",
		layers:  layers(ents(fileEnt("x", "x", 0o644), linkEnt(".", "x"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"root"},
		want:    []node{wFile("x", "x", 0o644)},
	}, {
		name:    "climbing name resolving to the root as a symlink",
		layers:  layers(ents(symEnt("a/..", tmpPH+"/outside"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"a/.."`, "root"},
	}, {
		name:    "root as a symlink in a later layer",
		layers:  layers(ents(fileEnt("x", "x", 0o644)), ents(symEnt("/", tmpPH+"/outside"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"root"},
		want:    []node{wFile("x", "x", 0o644)},
	}})
}

func TestUnpackDevicesSkipped(t *testing.T) {
	runUnpackCases(t, []unpackCase{{
		name: "char block and fifo",
		layers: layers(ents(
			devEnt("dev/null", tar.TypeChar), devEnt("dev/sda", tar.TypeBlock), devEnt("run/fifo", tar.TypeFifo),
			devEnt("../outside/secret", tar.TypeChar), fileEnt("after", "x", 0o644),
		)),
		want:  []node{wGone("dev"), wGone("run"), wFile("after", "x", 0o644)},
		warns: []string{`character device "dev/null"`, `block device "dev/sda"`, `FIFO "run/fifo"`, `"../outside/secret"`},
	}, {
		name:   "device over an existing file leaves it",
		layers: layers(ents(fileEnt("dev/null", "file", 0o644)), ents(devEnt("dev/null", tar.TypeChar))),
		want:   []node{wDir("dev", implicitDirMode), wFile("dev/null", "file", 0o644)},
		warns:  []string{"dev/null"},
	}})
}

func TestUnpackNames(t *testing.T) {
	long := strings.Repeat("n", 255)
	runUnpackCases(t, []unpackCase{{
		name:   "component of 255 bytes",
		layers: layers(ents(fileEnt("d/"+long, "x", 0o644), symEnt(long, long))),
		want:   []node{wDir("d", implicitDirMode), wFile("d/"+long, "x", 0o644), wSym(long, long)},
	}, {
		name:    "component of 256 bytes",
		layers:  layers(ents(fileEnt("d/"+long+"n", "x", 0o644))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"d/" + long + "n", "component longer"},
	}, {
		name:    "directory component of 256 bytes",
		layers:  layers(ents(dirEnt(long+"n/x/", 0o755))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"component longer"},
	}, {
		name:    "name over 4096 bytes",
		layers:  layers(ents(fileEnt(strings.Repeat("a/", 2048)+"b", "x", 0o644))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"4097 bytes"},
	}, {
		name:    "whiteout name over 4096 bytes",
		layers:  layers(ents(whEnt(strings.Repeat("a/", 2046) + ".wh.x"))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"longer than 4096"},
	}, {
		name:    "symlink target of 4096 bytes",
		layers:  layers(ents(symEnt("s", strings.Repeat("t/", 2048)))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"s"`, "symlink target"},
	}, {
		name:    "hardlink target over 4096 bytes",
		layers:  layers(ents(linkEnt("h", strings.Repeat("t/", 2049)))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"h"`},
	}, {
		name:    "empty name",
		layers:  layers(ents(tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "", Mode: 0o755}})),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{"empty entry name"},
	}, {
		name:    "empty symlink target",
		layers:  layers(ents(symEnt("s", ""))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"s"`, "symlink target"},
	}, {
		name:    "uid out of range",
		layers:  layers(ents(fileEnt("f", "x", 0o644).owner(1<<32-1, 0))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"f"`, "out of range"},
	}, {
		name:    "gid out of range",
		layers:  layers(ents(dirEnt("d/", 0o755).owner(0, 1<<32))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"d/"`, "out of range"},
	}, {
		name:    "negative uid",
		layers:  layers(ents(symEnt("s", "x").owner(-1, 0))),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"s"`, "out of range"},
	}, {
		name:    "unsupported entry type",
		layers:  layers(ents(tarEntry{hdr: tar.Header{Typeflag: 'Z', Name: "z", Mode: 0o644}})),
		wantErr: errdefs.ErrInvalidArgument,
		errHas:  []string{`"z"`, "unsupported"},
		want:    []node{wGone("z")},
	}})
}

func TestUnpackLimits(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	oneFile := func(name string) []tarEntry { return ents(fileEnt(name, big, 0o644)) }
	// Each one-file layer is a header block, the content and the two
	// end-of-archive blocks.
	layerSize := int64(512 + len(big) + 1024)
	runUnpackCases(t, []unpackCase{{
		name:      "one big file",
		opts:      &UnpackOptions{MaxBytes: 32 << 10},
		layers:    layers(oneFile("big")),
		wantLimit: "uncompressed bytes",
		errHas:    []string{`"big"`, "32768"},
		loose:     true, // the partial file may stay
	}, {
		name:   "exactly the budget",
		opts:   &UnpackOptions{MaxBytes: 3 * layerSize},
		layers: layers(oneFile("a"), oneFile("b"), oneFile("c"), ents()),
		// The fourth layer is empty: Apply on 0 bytes fits a spent budget.
		want: []node{wFile("a", big, 0o644), wFile("b", big, 0o644), wFile("c", big, 0o644)},
	}, {
		name:      "budget spread over layers",
		opts:      &UnpackOptions{MaxBytes: 3*layerSize - 1},
		layers:    layers(oneFile("a"), oneFile("b"), oneFile("c")),
		wantLimit: "uncompressed bytes",
		want:      []node{wFile("a", big, 0o644), wFile("b", big, 0o644)},
		loose:     true, // the partial c may stay
	}, {
		name:      "many entries",
		opts:      &UnpackOptions{MaxEntries: 5},
		layers:    layers(ents(fileEnt("1", "", 0o644), fileEnt("2", "", 0o644), fileEnt("3", "", 0o644), fileEnt("4", "", 0o644), fileEnt("5", "", 0o644), fileEnt("6", "", 0o644))),
		wantLimit: "entries",
		errHas:    []string{"5 entries"},
		loose:     true,
	}, {
		name:      "entries counted over layers",
		opts:      &UnpackOptions{MaxEntries: 3},
		layers:    layers(ents(fileEnt("1", "", 0o644), fileEnt("2", "", 0o644)), ents(fileEnt("3", "", 0o644), fileEnt("4", "", 0o644))),
		wantLimit: "entries",
		loose:     true,
	}})

	// A PAX 1.0 sparse file declares its logical size in a record; its holes
	// are read as zeros without a byte of the stream. 64 MiB of logical size
	// in a 3 KiB layer must not get past a 1 MiB budget.
	t.Run("sparse file larger than the budget", func(t *testing.T) {
		e := newUnpackEnv(t)
		const maxBytes, realSize = 1 << 20, 64 << 20
		layer := sparseTar(t, "bomb", realSize)
		_, err := e.applyAll(t, &UnpackOptions{MaxBytes: maxBytes}, [][]byte{layer})
		e.checkSentinel(t)
		var le *LimitError
		if !errors.As(err, &le) || le.What != "uncompressed bytes" {
			t.Errorf("error %v, want a LimitError on uncompressed bytes", err)
		}
		if fi, err := os.Lstat(filepath.Join(e.root, "bomb")); err == nil && fi.Size() > maxBytes {
			t.Errorf("a %d-byte layer wrote a %d-byte file under a budget of %d bytes", len(layer), fi.Size(), maxBytes)
		}
	})

	t.Run("trailing garbage after the end-of-archive marker", func(t *testing.T) {
		e := newUnpackEnv(t)
		layer := append(e.tar(t, ents(fileEnt("x", "x", 0o644))), bytes.Repeat([]byte{0xa5}, 1<<20)...)
		_, err := e.applyAll(t, &UnpackOptions{MaxBytes: 64 << 10}, [][]byte{layer})
		e.checkSentinel(t)
		var le *LimitError
		if !errors.As(err, &le) || le.What != "uncompressed bytes" {
			t.Fatalf("error %v, want a LimitError on uncompressed bytes", err)
		}
	})
}

// countingReader counts the bytes read and whether EOF was seen.
type countingReader struct {
	r   io.Reader
	n   int64
	eof bool
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err == io.EOF {
		c.eof = true
	}
	return n, err
}

func TestUnpackDrainsTrailingBytes(t *testing.T) {
	for _, trailer := range []int{0, 1, 511, 512, 3000, 2 << 20} {
		t.Run(strconv.Itoa(trailer), func(t *testing.T) {
			e := newUnpackEnv(t)
			layer := e.tar(t, ents(fileEnt("x", "x", 0o644)))
			layer = append(layer, bytes.Repeat([]byte{0}, trailer/2)...)
			layer = append(layer, bytes.Repeat([]byte{0x5a}, trailer-trailer/2)...)
			u, err := NewUnpacker(e.root, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			cr := &countingReader{r: bytes.NewReader(layer)}
			if err := u.Apply(context.Background(), cr); err != nil {
				t.Fatal(err)
			}
			if cr.n != int64(len(layer)) || !cr.eof {
				t.Errorf("read %d of %d bytes (EOF seen: %v), want all and EOF", cr.n, len(layer), cr.eof)
			}
			e.checkSentinel(t)
			e.checkTree(t, []node{wFile("x", "x", 0o644)}, true)
		})
	}
}

func TestUnpackStreams(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	random := make([]byte, 8192)
	rnd.Read(random)
	var gz bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(buildTar(t, ents(fileEnt("x", string(random), 0o644)), func(s string) string { return s }))
	gw.Close()
	valid := buildTar(t, ents(fileEnt("a", "a", 0o644), fileEnt("big", string(random), 0o644)), func(s string) string { return s })

	cases := []struct {
		name    string
		data    []byte
		wantErr error // errors.Is
		errHas  string
		want    []node
	}{
		{name: "empty stream", data: nil},
		{name: "only the end-of-archive marker", data: make([]byte, 1024)},
		{name: "no end-of-archive marker", data: valid[:len(valid)-1024], want: []node{wFile("a", "a", 0o644), wFile("big", string(random), 0o644)}},
		{name: "random bytes", data: random, wantErr: errdefs.ErrInvalidArgument, errHas: "not a tar stream"},
		{name: "gzip stream fed as uncompressed", data: gz.Bytes(), wantErr: errdefs.ErrInvalidArgument, errHas: "not a tar stream"},
		{name: "short random bytes", data: random[:100], wantErr: io.ErrUnexpectedEOF, errHas: "read layer"},
		{name: "one zero block then garbage", data: append(make([]byte, 512), random[:512]...), wantErr: errdefs.ErrInvalidArgument, errHas: "not a tar stream"},
		{name: "truncated in a file's content", data: valid[:1024+512+100], wantErr: io.ErrUnexpectedEOF, errHas: `"big"`},
		{name: "truncated in a header", data: valid[:1024+200], wantErr: io.ErrUnexpectedEOF, errHas: "read layer"},
		// archive/tar reports a stream cut in the padding after a file's
		// content as a clean end; the diff_id check catches the cut.
		{name: "truncated in padding", data: valid[:512+100], want: []node{wFile("a", "a", 0o644)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newUnpackEnv(t)
			_, err := e.applyAll(t, nil, [][]byte{c.data})
			e.checkSentinel(t)
			if c.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				e.checkTree(t, c.want, true)
				return
			}
			if !errors.Is(err, c.wantErr) || !strings.Contains(errText(err), c.errHas) {
				t.Errorf("error %v, want %v mentioning %q", err, c.wantErr, c.errHas)
			}
		})
	}

	t.Run("canceled context", func(t *testing.T) {
		e := newUnpackEnv(t)
		u, err := NewUnpacker(e.root, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := u.Apply(ctx, bytes.NewReader(valid)); !errors.Is(err, context.Canceled) {
			t.Errorf("error %v, want context.Canceled", err)
		}
		e.checkSentinel(t)
	})
}

func TestUnpackerSizeAndClose(t *testing.T) {
	e := newUnpackEnv(t)
	if _, err := NewUnpacker(filepath.Join(e.tmp, "missing"), nil); err == nil {
		t.Error("NewUnpacker on a missing directory: no error")
	}
	if _, err := NewUnpacker(e.secret, nil); err == nil {
		t.Error("NewUnpacker on a file: no error")
	}
	u, err := NewUnpacker(e.root, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range [][]tarEntry{
		ents(fileEnt("a", "12345", 0o644), dirEnt("d/", 0o755), symEnt("s", "a")),
		ents(fileEnt("a", "123", 0o644), linkEnt("h", "a"), fileEnt("d/b", "", 0o644)),
	} {
		if err := u.Apply(context.Background(), bytes.NewReader(e.tar(t, l))); err != nil {
			t.Fatal(err)
		}
	}
	if got := u.Size(); got != 8 {
		t.Errorf("Size() = %d, want 8", got)
	}
	if err := u.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := u.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	e.checkSentinel(t)
}

// decompressPayload is a layer-like payload: compressible text and random
// bytes.
func decompressPayload() []byte {
	rnd := rand.New(rand.NewSource(2))
	random := make([]byte, 20<<10)
	rnd.Read(random)
	return append([]byte(strings.Repeat("usr/lib/x86_64-linux-gnu/libc.so.6\n", 2000)), random...)
}

func gzipBytes(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := kgzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zstdBytes(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readDecompressed runs decompress on b and reads the result to the end.
func readDecompressed(b []byte) ([]byte, error) {
	rc, err := decompress(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func TestDecompressRoundTrip(t *testing.T) {
	payload := decompressPayload()
	for _, c := range []struct {
		name string
		data []byte
		want []byte
	}{
		{"gzip", gzipBytes(t, payload), payload},
		{"zstd", zstdBytes(t, payload), payload},
		{"plain", payload, payload},
		{"plain tar", buildTar(t, ents(fileEnt("x", "x", 0o644)), func(s string) string { return s }), nil},
		{"empty", nil, []byte{}},
		{"one byte", []byte{0x1f}, []byte{0x1f}},
		{"gzip of nothing", gzipBytes(t, nil), []byte{}},
		{"zstd of nothing", zstdBytes(t, nil), []byte{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := c.want
			if want == nil {
				want = c.data
			}
			got, err := readDecompressed(c.data)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("got %d bytes, want %d bytes", len(got), len(want))
			}
		})
	}
}

func TestDecompressDamaged(t *testing.T) {
	payload := decompressPayload()
	gz, zs := gzipBytes(t, payload), zstdBytes(t, payload)
	flip := func(b []byte, i int) []byte {
		b = bytes.Clone(b)
		b[i] ^= 0x10
		return b
	}
	for _, c := range []struct {
		name, format string
		data         []byte
	}{
		{"truncated gzip", "gzip", gz[:len(gz)/2]},
		{"gzip without its trailer", "gzip", gz[:len(gz)-8]},
		{"gzip cut in its header", "gzip", gz[:5]},
		{"corrupt gzip", "gzip", flip(gz, len(gz)/2)},
		{"gzip with a wrong CRC", "gzip", flip(gz, len(gz)-6)},
		{"truncated zstd", "zstd", zs[:len(zs)/2]},
		{"zstd without its checksum", "zstd", zs[:len(zs)-4]},
		{"zstd cut after its magic", "zstd", zs[:6]},
		{"corrupt zstd", "zstd", flip(zs, len(zs)/2)},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := readDecompressed(c.data)
			if err == nil || !strings.Contains(err.Error(), "decompress "+c.format+" layer") {
				t.Errorf("error %v, want one mentioning %q", err, "decompress "+c.format+" layer")
			}
		})
	}
}

// TestDecompressEveryCut cuts small compressed streams at every byte past
// the magic: each cut must be an error, never a short stream read as whole.
func TestDecompressEveryCut(t *testing.T) {
	payload := []byte(strings.Repeat("hello layer ", 50))
	for _, c := range []struct {
		format string
		data   []byte
		magic  int
	}{
		{"gzip", gzipBytes(t, payload), len(gzipMagic)},
		{"zstd", zstdBytes(t, payload), len(zstdMagic)},
	} {
		t.Run(c.format, func(t *testing.T) {
			for n := c.magic; n < len(c.data); n++ {
				got, err := readDecompressed(c.data[:n])
				if err == nil {
					t.Errorf("cut at %d of %d bytes: no error, %d bytes read", n, len(c.data), len(got))
				} else if !strings.Contains(err.Error(), "decompress "+c.format+" layer") {
					t.Errorf("cut at %d of %d bytes: error %q does not name the format", n, len(c.data), err)
				}
			}
		})
	}
}
