package pipcache

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

var helloFiles = map[string]string{"hello/__init__.py": "GREETING = 'hi'\n"}

// hello returns the entries of a valid wheel hello 1.0, edited by edit
// (RECORD is recomputed after the edit unless keepRecord).
func hello(edit func([]wheeltest.Entry) []wheeltest.Entry) []byte {
	es := wheeltest.Entries("hello", "1.0", helloFiles)
	return wheeltest.Zip(wheeltest.WithRecord("hello-1.0.dist-info", edit(es)))
}

// replace returns es with the body of the entry named name replaced.
func replace(name, body string) func([]wheeltest.Entry) []wheeltest.Entry {
	return func(es []wheeltest.Entry) []wheeltest.Entry {
		out := append([]wheeltest.Entry{}, es...)
		for i := range out {
			if out[i].Name == name {
				out[i].Body = []byte(body)
			}
		}
		return out
	}
}

// drop returns es without the entry named name.
func drop(name string) func([]wheeltest.Entry) []wheeltest.Entry {
	return func(es []wheeltest.Entry) []wheeltest.Entry {
		var out []wheeltest.Entry
		for _, e := range es {
			if e.Name != name {
				out = append(out, e)
			}
		}
		return out
	}
}

// add returns es with more entries.
func add(more ...wheeltest.Entry) func([]wheeltest.Entry) []wheeltest.Entry {
	return func(es []wheeltest.Entry) []wheeltest.Entry {
		return append(append([]wheeltest.Entry{}, es...), more...)
	}
}

// lyingBomb is a wheel one of whose entries declares 10 bytes and inflates
// to 8 MiB: reading must stop at the declared size.
func lyingBomb() []byte {
	es := wheeltest.Entries("hello", "1.0", helloFiles)
	big := make([]byte, 8<<20)
	var comp bytes.Buffer
	fw, _ := flate.NewWriter(&comp, flate.BestCompression)
	fw.Write(big)
	fw.Close()
	sum := sha256.Sum256(big)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range es {
		body := e.Body
		if strings.HasSuffix(e.Name, "/RECORD") {
			body = append(append([]byte{}, body...), fmt.Sprintf("hello/bomb.bin,sha256=%s,%d\n", base64.RawURLEncoding.EncodeToString(sum[:]), len(big))...)
		}
		w, _ := zw.Create(e.Name)
		w.Write(body)
	}
	w, _ := zw.CreateRaw(&zip.FileHeader{Name: "hello/bomb.bin", Method: zip.Deflate, CRC32: crc32.ChecksumIEEE(big),
		CompressedSize64: uint64(comp.Len()), UncompressedSize64: 10})
	w.Write(comp.Bytes())
	zw.Close()
	return buf.Bytes()
}

// withMethod is a valid wheel plus an entry compressed with method.
func withMethod(method uint16) []byte {
	es := wheeltest.Entries("hello", "1.0", helloFiles)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range es {
		w, _ := zw.Create(e.Name)
		w.Write(e.Body)
	}
	w, _ := zw.CreateRaw(&zip.FileHeader{Name: "hello/x.bz2", Method: method, CompressedSize64: 3, UncompressedSize64: 3})
	w.Write([]byte("abc"))
	zw.Close()
	return buf.Bytes()
}

func TestValidate(t *testing.T) {
	valid := wheeltest.Build("hello", "1.0", helloFiles)
	bomb := wheeltest.Build("hello", "1.0", map[string]string{"hello/zeros.txt": strings.Repeat("\x00", 8<<20)}) // 8 times its limit below
	di := "hello-1.0.dist-info"
	for _, tc := range []struct {
		name     string
		filename string // default hello-1.0-py3-none-any.whl
		wheel    []byte
		limits   Limits
		err      string // "" for a valid wheel
	}{
		{name: "valid", wheel: valid},
		{name: "valid with directory entries and a data directory", wheel: hello(add(wheeltest.Entry{Name: "hello/"}, wheeltest.Entry{Name: "hello-1.0.data/scripts/hi", Body: []byte("#!python\n")}))},
		{name: "normalized names and versions", filename: "Hello_World-1.0rc1-1-py3-none-any.whl",
			wheel: wheeltest.Zip(wheeltest.WithRecord("hello.world-1.0RC1.dist-info", []wheeltest.Entry{
				{Name: "hello.world-1.0RC1.dist-info/METADATA", Body: []byte("Name: HELLO-world\nVersion: 1.0.0rc1\n")},
				{Name: "hello.world-1.0RC1.dist-info/WHEEL", Body: []byte("Wheel-Version: 1.0\n")},
			}))},
		{name: "bad filename", filename: "hello.whl", wheel: valid, err: "want NAME-VERSION"},
		{name: "wrong name", filename: "other-1.0-py3-none-any.whl", wheel: valid, err: "does not match the filename"},
		{name: "wrong version in the filename", filename: "hello-1.1-py3-none-any.whl", wheel: valid, err: "does not match the filename"},
		{name: "not a zip", wheel: []byte("#!/bin/sh\necho not a wheel\n"), err: "not a readable zip"},
		{name: "truncated", wheel: valid[:len(valid)/2], err: "not a readable zip"},
		{name: "empty", wheel: nil, err: "not a readable zip"},
		{name: "METADATA name mismatch", wheel: hello(replace(di+"/METADATA", "Name: evil\nVersion: 1.0\n")), err: `METADATA names the project "evil"`},
		{name: "METADATA version mismatch", wheel: hello(replace(di+"/METADATA", "Name: hello\nVersion: 2.0\n")), err: `METADATA says version "2.0"`},
		{name: "METADATA name twice", wheel: hello(replace(di+"/METADATA", "Name: hello\nName: evil\nVersion: 1.0\n")), err: "exactly one non-empty Name"},
		{name: "METADATA without version", wheel: hello(replace(di+"/METADATA", "Name: hello\n\nVersion: 1.0\n")), err: "exactly one non-empty Version"},
		{name: "METADATA not UTF-8", wheel: hello(replace(di+"/METADATA", "Name: hello\xff\nVersion: 1.0\n")), err: "not UTF-8"},
		{name: "no METADATA", wheel: hello(drop(di + "/METADATA")), err: "has no hello-1.0.dist-info/METADATA"},
		{name: "WHEEL version 2", wheel: hello(replace(di+"/WHEEL", "Wheel-Version: 2.0\n")), err: "only 1.x"},
		{name: "two dist-info directories", wheel: hello(add(wheeltest.Entry{Name: "evil-1.0.dist-info/METADATA", Body: []byte("Name: evil\nVersion: 1.0\n")})), err: "2 .dist-info directories"},
		{name: "traversal", wheel: hello(add(wheeltest.Entry{Name: "../../etc/cron.d/evil", Body: []byte("x")})), err: "path traversal"},
		{name: "traversal inside", wheel: hello(add(wheeltest.Entry{Name: "hello/../../evil.py", Body: []byte("x")})), err: "path traversal"},
		{name: "absolute name", wheel: hello(add(wheeltest.Entry{Name: "/etc/evil", Body: []byte("x")})), err: "absolute name"},
		{name: "backslash", wheel: hello(add(wheeltest.Entry{Name: `..\evil.py`, Body: []byte("x")})), err: "backslash"},
		{name: "drive letter", wheel: hello(add(wheeltest.Entry{Name: "C:/evil.py", Body: []byte("x")})), err: "drive letter"},
		{name: "dot component", wheel: hello(add(wheeltest.Entry{Name: "hello/./x.py", Body: []byte("x")})), err: "'.' path component"},
		{name: "duplicate entries", wheel: hello(add(wheeltest.Entry{Name: "hello/__init__.py", Body: []byte("import os; os.system('evil')\n")})), err: "appears twice"},
		{name: "duplicate directories", wheel: hello(add(wheeltest.Entry{Name: "hello/"}, wheeltest.Entry{Name: "hello/"})), err: "appears twice"},
		{name: "file and directory", wheel: hello(add(wheeltest.Entry{Name: "hello/__init__.py/x", Body: []byte("x")})), err: "both a file and a directory"},
		{name: "symlink", wheel: hello(add(wheeltest.Entry{Name: "hello/passwd", Body: []byte("/etc/passwd"), Mode: fs.ModeSymlink | 0o777})), err: "symbolic link"},
		{name: "named pipe", wheel: hello(add(wheeltest.Entry{Name: "hello/fifo", Mode: fs.ModeNamedPipe | 0o644})), err: "named pipe"},
		{name: "file not in RECORD", wheel: wheeltest.Zip(append(wheeltest.Entries("hello", "1.0", helloFiles), wheeltest.Entry{Name: "hello/extra.py", Body: []byte("x")})), err: "hello/extra.py is not listed in RECORD"},
		{name: "file altered after RECORD", wheel: wheeltest.Zip(replace("hello/__init__.py", "EVIL = 'hacked'\n")(wheeltest.Entries("hello", "1.0", helloFiles))), err: "does not match RECORD"},
		{name: "RECORD lists a missing file", wheel: wheeltest.Zip(wheeltest.Entries("hello", "1.0", helloFiles)[1:]), err: "RECORD lists hello/__init__.py"},
		{name: "RECORD with md5", wheel: wheeltest.Zip(append(drop(di+"/RECORD")(wheeltest.Entries("hello", "1.0", helloFiles)),
			wheeltest.Entry{Name: di + "/RECORD", Body: []byte("hello/__init__.py,md5=abc,16\n")})), err: "want sha256="},
		{name: "no RECORD", wheel: wheeltest.Zip(wheeltest.Entries("hello", "1.0", helloFiles)[:3]), err: "has no hello-1.0.dist-info/RECORD"},
		{name: "bzip2 entry", wheel: withMethod(12), err: "compression method 12"},
		{name: "oversized wheel", wheel: valid, limits: Limits{MaxWheelBytes: 100}, err: "more than the limit of 100"},
		{name: "zip bomb", wheel: bomb, limits: Limits{MaxUnpackedBytes: 1 << 20}, err: "unpack to more than the limit"},
		{name: "lying zip bomb", wheel: lyingBomb(), err: "read hello/bomb.bin"},
		{name: "too many entries", wheel: valid, limits: Limits{MaxEntries: 3}, err: "4 entries"},
		{name: "huge METADATA", wheel: hello(replace(di+"/METADATA", "Name: hello\nVersion: 1.0\n\n"+strings.Repeat("x", 2<<20))), limits: Limits{MaxMetadataBytes: 1 << 20}, err: "METADATA is 2097178 bytes, more than the limit of 1048576"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			filename := tc.filename
			if filename == "" {
				filename = "hello-1.0-py3-none-any.whl"
			}
			w, err := Validate(context.Background(), bytes.NewReader(tc.wheel), int64(len(tc.wheel)), filename, &tc.limits)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if w.Filename != filename || w.Size != int64(len(tc.wheel)) {
					t.Fatalf("got %+v", w)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("got %v; want an invalid-argument error with %q", err, tc.err)
			}
		})
	}
}

func TestValidateResult(t *testing.T) {
	b := wheeltest.Zip(wheeltest.WithRecord("Hello_World-1.0.dist-info", []wheeltest.Entry{
		{Name: "Hello_World-1.0.dist-info/METADATA", Body: []byte("Name: Hello.World\nVersion: 1.00\n")},
		{Name: "Hello_World-1.0.dist-info/WHEEL", Body: []byte("Wheel-Version: 1.0\n")},
	}))
	w, err := Validate(context.Background(), bytes.NewReader(b), int64(len(b)), "Hello_World-1.0-py3-none-any.whl", nil)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "hello-world" || w.Version != "1.00" {
		t.Fatalf("got %+v", w)
	}
}

func TestValidateCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := wheeltest.Build("hello", "1.0", helloFiles)
	if _, err := Validate(ctx, bytes.NewReader(b), int64(len(b)), "hello-1.0-py3-none-any.whl", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}
