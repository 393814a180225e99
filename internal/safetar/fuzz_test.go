package safetar

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzExtract: whatever the stream, Extract writes nothing outside its
// directory, even where that directory holds links that lead out.
// go test runs the seeds; make fuzz runs it for FUZZTIME.
func FuzzExtract(f *testing.F) {
	seeds := [][]entry{
		{dir("d/"), file("d/f", "f"), symlink("d/l", "f")},
		{file("../outside/f", "x")},
		{file("/tmp/flmbox-fuzz-absolute", "x")},
		{symlink("l", "../outside"), file("l/f", "x")},
		{symlink("l", "/"), dir("l/d/")},
		{file("out/f", "through the link there before")},
		{file("abs/f", "through the absolute link there before")},
		{hardlink("h", "../outside/keep")},
		{{name: "null", typ: tar.TypeChar}, {name: "fifo", typ: tar.TypeFifo}},
		{dir("a/"), symlink("a", "../outside"), file("a/f", "x")},
		{symlink("out", "elsewhere"), file("out", "replaces the link")},
		{dir("./"), {name: "./", typ: tar.TypeDir, mode: 0o000}},
	}
	for _, s := range seeds {
		f.Add(buildTar(f, s...), "")
		f.Add(buildTar(f, s...), "top")
	}
	f.Add([]byte("not a tar stream"), "")
	f.Add(buildTar(f, file("x", "x")), "out")
	f.Fuzz(func(t *testing.T, stream []byte, top string) {
		parent, root, outside := escapeLayout(t)
		if err := os.Symlink("../outside", filepath.Join(root, "out")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(root, "abs")); err != nil {
			t.Fatal(err)
		}
		if !validTop(top) {
			top = "" // Top comes from the caller, never from the stream
		}
		Extract(openRoot(t, root), bytes.NewReader(stream), Options{MaxBytes: 1 << 20, Top: top})
		assertOutsideUntouched(t, parent, outside)
		if _, err := os.Stat("/tmp/flmbox-fuzz-absolute"); err == nil {
			os.Remove("/tmp/flmbox-fuzz-absolute")
			t.Fatal("Extract wrote an absolute name")
		}
	})
}

// validTop says whether top is a name a caller passes as Top: one
// component, not "." or "..".
func validTop(top string) bool {
	return top == "" || top != "." && top != ".." && !bytes.ContainsAny([]byte(top), "/\x00")
}
