// Package wheeltest builds wheels in memory for tests: valid pure-Python
// wheels, and the pieces to build broken ones (any entry names, modes,
// METADATA or RECORD).
package wheeltest

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
)

// Entry is one entry of a zip archive.
type Entry struct {
	// Name is the entry's name, used as is (directories end in /).
	Name string
	// Body is a file's content.
	Body []byte
	// Mode is the entry's mode; 0 means a regular file of mode 0644 (or a
	// directory if Name ends in /).
	Mode fs.FileMode
}

// Escape returns name as a wheel filename writes it: every run of -, _
// and . replaced by _.
func Escape(name string) string { return regexp.MustCompile(`[-_.]+`).ReplaceAllString(name, "_") }

// Filename returns the filename of a pure-Python wheel:
// NAME-VERSION-py3-none-any.whl.
func Filename(name, version string) string {
	return fmt.Sprintf("%s-%s-py3-none-any.whl", Escape(name), version)
}

// DistInfo returns the wheel's metadata directory, NAME-VERSION.dist-info.
func DistInfo(name, version string) string { return Escape(name) + "-" + version + ".dist-info" }

// Entries returns the entries of a valid pure-Python wheel of project
// name and version holding files (path → content), METADATA, WHEEL and
// RECORD, in a stable order (RECORD last).
func Entries(name, version string, files map[string]string) []Entry {
	var es []Entry
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		es = append(es, Entry{Name: p, Body: []byte(files[p])})
	}
	di := DistInfo(name, version)
	es = append(es,
		Entry{Name: di + "/METADATA", Body: []byte(Metadata(name, version))},
		Entry{Name: di + "/WHEEL", Body: []byte("Wheel-Version: 1.0\nGenerator: wheeltest\nRoot-Is-Purelib: true\nTag: py3-none-any\n")},
	)
	return WithRecord(di, es)
}

// Metadata returns a minimal METADATA file.
func Metadata(name, version string) string {
	return fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: a wheel built by a test\n\nLong description.\n", name, version)
}

// WithRecord returns es without any entry named distInfo/RECORD, followed
// by a RECORD listing every file of es with its sha256 and size.
func WithRecord(distInfo string, es []Entry) []Entry {
	var out []Entry
	var rec strings.Builder
	for _, e := range es {
		if e.Name == distInfo+"/RECORD" {
			continue
		}
		out = append(out, e)
		if strings.HasSuffix(e.Name, "/") {
			continue
		}
		sum := sha256.Sum256(e.Body)
		fmt.Fprintf(&rec, "%s,sha256=%s,%d\n", e.Name, base64.RawURLEncoding.EncodeToString(sum[:]), len(e.Body))
	}
	fmt.Fprintf(&rec, "%s/RECORD,,\n", distInfo)
	return append(out, Entry{Name: distInfo + "/RECORD", Body: []byte(rec.String())})
}

// Zip writes es as a zip archive, deflated, in order (duplicates kept).
func Zip(es []Entry) []byte {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range es {
		mode := e.Mode
		if mode == 0 {
			mode = 0o644
			if strings.HasSuffix(e.Name, "/") {
				mode = fs.ModeDir | 0o755
			}
		}
		h := &zip.FileHeader{Name: e.Name, Method: zip.Deflate}
		h.SetMode(mode)
		if mode.IsDir() {
			h.Method = zip.Store
		}
		w, err := zw.CreateHeader(h)
		if err != nil {
			panic(err) // only for names archive/zip refuses to write, which tests do not use
		}
		w.Write(e.Body)
	}
	if err := zw.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// Build returns a valid pure-Python wheel of name and version holding
// files (Zip of Entries).
func Build(name, version string, files map[string]string) []byte {
	return Zip(Entries(name, version, files))
}
