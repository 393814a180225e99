package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A FuzzUnpack input is one flags byte, the lengths of layers 1 and 2 in
// 512-byte blocks (tar streams are made of blocks), then the layers' bytes;
// what follows layer 2 is layer 3. With fuzzExpand set, each layer is read
// as a tar stream and written again with tmpPH in names and link targets
// replaced by the real temporary directory, so that seeds can aim symlinks
// and hardlinks at the host's sentinel; without it the bytes are applied as
// they are, malformed headers and all. With fuzzStored set, each layer is
// stored first (storeLayer) and applied from the layer store (ApplyStored),
// as a pull does.
const (
	fuzzExpand     = 1 << 0
	fuzzStored     = 1 << 1
	fuzzHeaderSize = 3
)

// fuzzSeed is a named FuzzUnpack seed of up to three layers. The seeds are
// also stored under testdata/fuzz/FuzzUnpack as seed-NAME; see
// TestFuzzUnpackCorpus.
type fuzzSeed struct {
	name   string
	layers [][]tarEntry
}

func fuzzSeeds() []fuzzSeed {
	const out = tmpPH + "/outside"
	return []fuzzSeed{
		{"abs-symlink-same-layer", layers(ents(symEnt("evil", out), fileEnt("evil/secret", "pwned", 0o777)))},
		{"abs-symlink-later-layer", layers(ents(dirEnt(out+"/", 0o755), symEnt("evil", out)), ents(fileEnt("evil/secret", "pwned", 0o777), dirEnt("evil/", 0o777)))},
		{"symlink-to-slash", layers(ents(symEnt("evil", "/")), ents(fileEnt("evil/secret", "pwned", 0o644), fileEnt("evil/evil/x", "x", 0o644)))},
		{"relative-climbing-symlink", layers(ents(symEnt("evil", "../outside"), fileEnt("evil/secret", "pwned", 0o644)), ents(dirEnt("outside/", 0o755), fileEnt("evil/secret", "pwned", 0o644), symEnt("d/e", "../../outside"), fileEnt("d/e/f", "x", 0o644)))},
		{"dir-replaced-by-symlink", layers(ents(dirEnt("d/", 0o755), fileEnt("d/old", "o", 0o644)), ents(symEnt("d", out)), ents(fileEnt("d/secret", "pwned", 0o644), dirEnt("d/sub/", 0o700)))},
		{"hardlink-through-symlink", layers(ents(symEnt("evil", out), symEnt("rel", "../outside")), ents(linkEnt("h", "evil/secret"), linkEnt("h2", "rel/secret"), linkEnt("h3", out+"/secret")))},
		{"chmod-through-hardlinked-symlink", layers(ents(symEnt("s", out+"/secret"), linkEnt("h", "s")), ents(dirEnt("s/", 0o777), fileEnt("h", "x", 0o4777)), ents(linkEnt("h2", "h"), dirEnt("h2/", 0o777)))},
		{"dir-header-then-symlink", layers(ents(dirEnt("d/", 0o777).at(t1), symEnt("d", out), dirEnt("e/", 0o777), symEnt("e", out+"/secret"), dirEnt("f/", 0o700), symEnt("f", "/")))},
		{"whiteout-climbing", layers(ents(fileEnt("x", "x", 0o644)), ents(whEnt("../outside/.wh.secret"), whEnt("/../outside/.wh..wh..opq")))},
		{"whiteout-through-symlink", layers(ents(symEnt("evil", out), symEnt("root", "/")), ents(whEnt("evil/.wh.secret"), whEnt("evil/.wh..wh..opq"), whEnt("root/.wh.evil")))},
		{"whiteouts", layers(ents(fileEnt("a/b/c", "c", 0o644), fileEnt("x", "x", 0o644), dirEnt("d/", 0o755), fileEnt("d/f", "f", 0o644)), ents(whEnt(".wh.x"), whEnt("a/.wh.b"), fileEnt("d/g", "g", 0o644), whEnt(".wh.d"), whEnt(".wh.")))},
		{"opaque", layers(ents(dirEnt("d/", 0o755), fileEnt("d/a", "a", 0o644), fileEnt("d/sub/deep", "x", 0o644)), ents(fileEnt("d/sub/new", "n", 0o644), whEnt("d/.wh..wh..opq"), fileEnt("d/b", "b", 0o644)))},
		{"opaque-root", layers(ents(fileEnt("a", "a", 0o644), symEnt("l", out)), ents(whEnt(".wh..wh..opq"), fileEnt("b", "b", 0o644)))},
		{"type-changes", layers(ents(dirEnt("p/", 0o755), fileEnt("p/c", "c", 0o644), fileEnt("q", "q", 0o644), dirEnt("t/", 0o755), symEnt("r", "t")), ents(fileEnt("p", "p", 0o644), dirEnt("q/", 0o700), dirEnt("r/", 0o700), symEnt("t", "p")), ents(fileEnt("q", "again", 0o600), dirEnt("q/", 0o755)))},
		{"root-entry", layers(ents(dirEnt(".", 0o700), dirEnt("./", 0o755)), ents(symEnt(".", out)), ents(symEnt("a/..", "/")))},
		{"climbing-names", layers(ents(fileEnt("../outside/secret", "pwned", 0o777), fileEnt("/etc/x", "x", 0o644), fileEnt("a/../../x", "x", 0o644), dirEnt("../", 0o777), dirEnt("../outside/", 0o777)))},
		{"devices", layers(ents(devEnt("dev/null", tar.TypeChar), devEnt("dev/sda", tar.TypeBlock), devEnt("fifo", tar.TypeFifo), devEnt("../outside/secret", tar.TypeFifo)))},
		{"hardlinks", layers(ents(fileEnt("a", "a", 0o644), linkEnt("b", "a"), linkEnt("c", "/b"), fileEnt("a", "new", 0o644), dirEnt("d/", 0o755)), ents(linkEnt("e", "e"), linkEnt("f", "d"), linkEnt("g", "../outside/secret"), linkEnt("h", "missing")))},
		{"modes-and-times", layers(ents(fileEnt("suid", "x", 0o4755).at(t1), fileEnt("sgid", "x", 0o2755), dirEnt("tmp/", 0o1777).at(t2), symEnt("tmp/l", "../suid").at(t3), dirEnt("ro/", 0o555), fileEnt("ro/f", "f", 0o444)), ents(fileEnt("ro/g", "g", 0o444)))},
		{"symlinks-removed-not-followed", layers(ents(dirEnt("d/", 0o755), symEnt("d/l", out), symEnt("d/s", out+"/secret"), symEnt("x", out+"/secret")), ents(whEnt("d/.wh..wh..opq"), whEnt(".wh.x")))},
		{"long-names", layers(ents(fileEnt(strings.Repeat("n", 255), "x", 0o644), symEnt("l", strings.Repeat("../", 40)+"outside")), ents(fileEnt(strings.Repeat("m", 256), "x", 0o644)))},
		{"owners", layers(ents(fileEnt("f", "x", 0o4755).owner(1000, 1000), dirEnt("d/", 0o2755).owner(5, 6), symEnt("l", out).owner(7, 8)), ents(fileEnt("g", "x", 0o644).owner(1<<32-1, 0)))},
	}
}

// encodeFuzzInput lays seed layers out as a FuzzUnpack input. The layers'
// end-of-archive markers are left out (a stream that ends on a block boundary
// ends the archive) to keep the corpus small.
func encodeFuzzInput(tb testing.TB, ls [][]tarEntry) []byte {
	tb.Helper()
	if len(ls) > 3 {
		tb.Fatalf("%d layers, at most 3", len(ls))
	}
	in := make([]byte, fuzzHeaderSize)
	for i, l := range ls {
		for _, te := range l {
			if strings.Contains(te.hdr.Name+te.hdr.Linkname, tmpPH) {
				in[0] |= fuzzExpand
			}
		}
		b := buildTar(tb, l, func(s string) string { return s })
		b = b[:len(b)-1024]
		if i < 2 {
			if len(b)/512 > 255 {
				tb.Fatalf("layer %d has %d blocks, at most 255", i, len(b)/512)
			}
			in[1+i] = byte(len(b) / 512)
		}
		in = append(in, b...)
	}
	return in
}

// decodeFuzzInput splits a FuzzUnpack input into three layers.
func decodeFuzzInput(data []byte) (flags byte, layers [3][]byte) {
	if len(data) < fuzzHeaderSize {
		return 0, layers
	}
	flags, rest := data[0], data[fuzzHeaderSize:]
	for i := range 2 {
		n := min(int(data[1+i])*512, len(rest))
		layers[i], rest = rest[:n], rest[n:]
	}
	layers[2] = rest
	return flags, layers
}

// expandLayer reads raw as a tar stream, up to its first error, and writes
// it again with names and link targets passed through expand.
func expandLayer(raw []byte, expand func(string) string) []byte {
	tr := tar.NewReader(bytes.NewReader(raw))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for {
		hdr, err := tr.Next()
		if err != nil || hdr.Size > 1<<20 {
			break
		}
		h := *hdr
		h.Name, h.Linkname = expand(h.Name), expand(h.Linkname)
		h.Format = tar.FormatUnknown
		if tw.WriteHeader(&h) != nil {
			break
		}
		if _, err := io.Copy(tw, tr); err != nil {
			break
		}
	}
	tw.Close()
	return buf.Bytes()
}

// fuzzMountPoints are made in every tree FuzzUnpack unpacks.
var fuzzMountPoints = append(slices.Clone(sandboxPoints),
	MountPoint{Path: "/etc/mp", Type: MountPointDir}, MountPoint{Path: "/a/b/mp", Type: MountPointFile})

func FuzzUnpack(f *testing.F) {
	for _, s := range fuzzSeeds() {
		in := encodeFuzzInput(f, s.layers)
		f.Add(in)
		stored := slices.Clone(in)
		stored[0] |= fuzzStored
		f.Add(stored)
	}
	// One tree serves input after input, emptied in between, while they
	// pass: a fresh one per input costs more than most inputs do. An input
	// that fails leaves its tree as it is and the next gets a new one.
	base, stores := f.TempDir(), f.TempDir()
	var e *unpackEnv
	f.Cleanup(func() {
		if e != nil {
			makeRemovable(e.root)
		}
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		flags, raw := decodeFuzzInput(data)
		if e == nil {
			dir, err := os.MkdirTemp(base, "")
			if err != nil {
				t.Fatal(err)
			}
			e = newUnpackEnvIn(t, dir)
		} else {
			e.emptyRoot(t)
		}
		defer func() {
			if t.Failed() {
				e = nil
			}
		}()
		var layers [][]byte
		for _, l := range raw {
			if flags&fuzzExpand != 0 {
				l = expandLayer(l, e.expand)
			}
			layers = append(layers, l)
		}
		o := &UnpackOptions{MaxBytes: 8 << 20, MaxEntries: 2000}
		u, err := NewUnpacker(e.root, o)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		for _, l := range layers {
			if flags&fuzzStored == 0 {
				if err := u.Apply(context.Background(), bytes.NewReader(l)); err != nil {
					break
				}
				continue
			}
			dir, err := os.MkdirTemp(stores, "")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			if _, err := storeLayer(context.Background(), bytes.NewReader(l), dir, o); err != nil {
				break
			}
			if err := u.ApplyStored(context.Background(), dir); err != nil {
				break
			}
		}
		// Mount points are made in whatever the layers left, confined as
		// the layers' entries are.
		prepareMountPoints(e.root, fuzzMountPoints)
		e.checkSentinel(t)
		// Nothing outside root but the sentinel.
		err = filepath.WalkDir(e.tmp, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch p {
			case e.root:
				return filepath.SkipDir
			case e.tmp, e.outside, e.secret:
				return nil
			}
			t.Errorf("%s exists outside root", p)
			return nil
		})
		if err != nil {
			t.Errorf("walk %s: %v", e.tmp, err)
		}
	})
}

// emptyRoot removes what the last input left in root.
func (e *unpackEnv) emptyRoot(t *testing.T) {
	t.Helper()
	makeRemovable(e.root)
	if err := os.RemoveAll(e.root); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestFuzzUnpackCorpus checks that testdata/fuzz/FuzzUnpack holds the seeds
// of fuzzSeeds. FLMBOX_WRITE_FUZZ_CORPUS=1 writes them instead.
func TestFuzzUnpackCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzUnpack")
	write := os.Getenv("FLMBOX_WRITE_FUZZ_CORPUS") == "1"
	if write {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range fuzzSeeds() {
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", encodeFuzzInput(t, s.layers))
		p := filepath.Join(dir, "seed-"+s.name)
		if write {
			if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("%s is missing or stale (%v): run FLMBOX_WRITE_FUZZ_CORPUS=1 go test -run TestFuzzUnpackCorpus ./rootfs/", p, err)
		}
	}
}
