package safetar

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// TestExtractSparse: a file's zero blocks become holes, whatever their
// place (start, middle, end, a partial last block), and its contents and
// size are the stream's.
func TestExtractSparse(t *testing.T) {
	const size = 16 << 20 // 16 copy buffers
	body := make([]byte, size)
	copy(body[5<<20:], "middle")
	copy(body[size-3:], "end")
	for _, tc := range []struct {
		name string
		body []byte
		max  int64 // allocated bytes at most
	}{
		{"holes", body, 1 << 20},
		{"all zeros", make([]byte, size), 0},
		{"zeros and a partial block", append(make([]byte, 3*holeBytes), 'x', 0, 0), 64 << 10},
		{"a partial zero block at the end", append(bytes.Repeat([]byte{'x'}, holeBytes), 0, 0, 0), 64 << 10},
		{"no holes", bytes.Repeat([]byte{'y'}, 3*holeBytes+5), 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(tc.body))})
			tw.Write(tc.body)
			tw.Close()
			if err := extract(t, root, buf.Bytes(), Options{}); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(root, "f"))
			if err != nil || !bytes.Equal(got, tc.body) {
				t.Fatalf("the file's contents differ (%d bytes, want %d): %v", len(got), len(tc.body), err)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(root, "f"), &st); err != nil {
				t.Fatal(err)
			}
			if st.Blocks*512 > tc.max {
				t.Errorf("%d bytes allocated, want at most %d", st.Blocks*512, tc.max)
			}
		})
	}
}

// TestArchiveSparseRoundTrip: a sparse file archived and extracted again
// is sparse again.
func TestArchiveSparseRoundTrip(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	f, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20 // 64 times the allocation allowed
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), size-4)
	f.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(Archive(pw, filepath.Join(src, "sparse"), "sparse", 0)) }()
	if err := Extract(openRoot(t, dst), pr, Options{}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "sparse"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 > 1<<20 {
		t.Errorf("extracted: %d bytes, %d allocated; want %d bytes in holes", st.Size, st.Blocks*512, size)
	}
}

// failingReader gives r, then err.
type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// TestExtractNoPartialFile: a stream that fails in the middle of a file
// leaves no part of it, nor a temporary file, and the files finished before
// it in place (without Atomic); a file replaced is replaced whole or not.
func TestExtractNoPartialFile(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "b"), []byte("old b"), 0o644); err != nil {
		t.Fatal(err)
	}
	stream := buildTar(t, file("a", "a"), dir("d/"), file("d/c", "c"), file("b", strings.Repeat("b", 100<<10)))
	cut := &failingReader{bytes.NewReader(stream[:len(stream)-60<<10]), errors.New("the sandbox went away")}
	err := Extract(openRoot(t, root), cut, Options{})
	if err == nil || !strings.Contains(err.Error(), "the sandbox went away") {
		t.Fatalf("Extract: %v, want the stream's error", err)
	}
	want := map[string]string{"a": "a", "b": "old b", "d": "", "d/c": "c"}
	if got := listing(t, root); !sameListing(got, want) {
		t.Errorf("after a failed extraction: %v, want %v", got, want)
	}
}

// TestExtractAtomic: with Atomic, a stream that fails at any point, even
// after its last entry, leaves nothing that was not there (files replaced
// are kept as they were, directories made are removed, no temporary file);
// a stream that ends well puts all in place.
func TestExtractAtomic(t *testing.T) {
	entries := []entry{dir("top/"), file("top/a", "new a"), dir("top/sub/"), file("top/sub/b", "b"), symlink("top/l", "a"), file("top/big", strings.Repeat("x", 200<<10))}
	stream := buildTar(t, entries...)
	before := func(t *testing.T) string {
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "top"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "top", "a"), []byte("old a"), 0o644); err != nil {
			t.Fatal(err)
		}
		return root
	}
	for _, cut := range []int{0, 512, 2048, len(stream) / 2, len(stream) - 1024, len(stream)} {
		root := before(t)
		r := &failingReader{bytes.NewReader(stream[:cut]), errors.New("refused by the sandbox")}
		if err := Extract(openRoot(t, root), r, Options{Atomic: true}); err == nil {
			t.Fatalf("cut at %d of %d: no error", cut, len(stream))
		}
		if got, want := listing(t, root), map[string]string{"top": "", "top/a": "old a"}; !sameListing(got, want) {
			t.Errorf("cut at %d of %d: %v, want %v", cut, len(stream), got, want)
		}
	}
	// As a new top, renamed: nothing of it is left.
	root := t.TempDir()
	r := &failingReader{bytes.NewReader(stream[:len(stream)/2]), errors.New("refused")}
	if err := Extract(openRoot(t, root), r, Options{Atomic: true, Top: "renamed"}); err == nil {
		t.Fatal("no error")
	}
	if got := listing(t, root); len(got) != 0 {
		t.Errorf("a failed extraction of a new tree left %v", got)
	}
	// Whole: all in place.
	root = before(t)
	if err := Extract(openRoot(t, root), bytes.NewReader(stream), Options{Atomic: true}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"top": "", "top/a": "new a", "top/sub": "", "top/sub/b": "b", "top/l": "-> a", "top/big": strings.Repeat("x", 200<<10)}
	if got := listing(t, root); !sameListing(got, want) {
		t.Errorf("after the whole stream: %v", got)
	}
}

// TestExtractNoSpace: a full filesystem is a resource exhausted error, and
// leaves no partial file.
func TestExtractNoSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a small tmpfs: needs root")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	stream := buildTar(t, file("small", "s"), file("big", strings.Repeat("x", 2<<20)))
	err := Extract(openRoot(t, root), bytes.NewReader(stream), Options{})
	if !errdefs.IsResourceExhausted(err) || !errors.Is(err, unix.ENOSPC) {
		t.Errorf("Extract into a full filesystem: %v, want resource exhausted", err)
	}
	if got, want := listing(t, root), map[string]string{"small": "s"}; !sameListing(got, want) {
		t.Errorf("after ENOSPC: %v, want %v", got, want)
	}
}

// listing maps each path below root to a file's contents, "-> TARGET" for
// a link, "" for a directory.
func listing(t *testing.T, root string) map[string]string {
	t.Helper()
	got := map[string]string{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			got[rel] = "-> " + l
		case fi.IsDir():
			got[rel] = ""
		default:
			b, _ := os.ReadFile(p)
			got[rel] = string(b)
		}
		return nil
	})
	return got
}

func sameListing(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
