package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestWriteFile: a new file and a replaced one hold what was written, with
// the mode asked; nothing else is left in the directory.
func TestWriteFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before []byte // nil: no file before
		perm   os.FileMode
	}{
		{"new", nil, 0o600},
		{"replace", []byte("old content, longer than the new"), 0o644},
		{"executable", nil, 0o755},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f.json")
			if tc.before != nil {
				if err := os.WriteFile(p, tc.before, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := WriteFile(p, []byte(`{"a":1}`), tc.perm); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(p)
			if err != nil || string(b) != `{"a":1}` {
				t.Errorf("read back %q, %v", b, err)
			}
			if fi, err := os.Stat(p); err != nil || fi.Mode() != tc.perm {
				t.Errorf("mode %v, %v; want %v", fi.Mode(), err, tc.perm)
			}
			assertOnly(t, dir, "f.json")
		})
	}
}

// TestWriteFromFails: a write that fails leaves the file as it was and no
// temporary file.
func TestWriteFromFails(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader("partial"), errReader{boom})
	if err := WriteFrom(p, r, 0o600); !errors.Is(err, boom) {
		t.Fatalf("WriteFrom: %v, want the reader's error", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("file holds %q after a failed write", b)
	}
	assertOnly(t, dir, "f")

	// A rename that fails (a directory is in the way) removes the temporary.
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "d", "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "d"), []byte("x"), 0o600); err == nil {
		t.Fatal("WriteFile over a directory succeeded")
	}
	assertOnly(t, dir, "d", "f")

	if err := WriteFile(filepath.Join(dir, "missing", "f"), nil, 0o600); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WriteFile in a missing directory: %v, want ErrNotExist", err)
	}
}

// TestConcurrent: writers at once each rename a whole file of their own;
// the file ends as one of them wrote it.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	contents := []string{"aaaa", "bbbbbbbb", "cc"}
	var wg sync.WaitGroup
	for range 20 {
		for _, c := range contents {
			wg.Go(func() {
				if err := WriteFile(p, []byte(c), 0o600); err != nil {
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	ok := false
	for _, c := range contents {
		ok = ok || string(b) == c
	}
	if !ok {
		t.Errorf("file holds %q, none of the writes", b)
	}
	assertOnly(t, dir, "f")
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, names) {
		t.Errorf("directory holds %q, want %q", got, names)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
