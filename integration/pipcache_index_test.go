//go:build integration

package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

// wheelIndex is a PEP 503 "simple" package index on loopback, served by
// the test: /simple/ lists the projects, /simple/NAME/ a project's wheels
// (with their sha256), /files/FILENAME serves a wheel.
type wheelIndex struct {
	srv      *httptest.Server
	wheels   map[string][]byte // by filename
	requests atomic.Int64
}

// startIndex serves wheels (filename → content) on 127.0.0.1.
func startIndex(t testing.TB, wheels map[string][]byte) *wheelIndex {
	t.Helper()
	ix := &wheelIndex{wheels: wheels}
	projects := map[string][]string{}
	for fn := range wheels {
		f, err := pipcache.ParseFilename(fn)
		if err != nil {
			t.Fatal(err)
		}
		projects[f.Name()] = append(projects[f.Name()], fn)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/{$}", func(w http.ResponseWriter, r *http.Request) {
		var names []string
		for p := range projects {
			names = append(names, p)
		}
		sort.Strings(names)
		fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
		for _, p := range names {
			fmt.Fprintf(w, "<a href=\"%s/\">%s</a>\n", p, p)
		}
		fmt.Fprint(w, "</body></html>\n")
	})
	mux.HandleFunc("GET /simple/{project}/{$}", func(w http.ResponseWriter, r *http.Request) {
		files, ok := projects[r.PathValue("project")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
		for _, fn := range files {
			sum := sha256.Sum256(wheels[fn])
			fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\">%s</a>\n", html.EscapeString(fn), hex.EncodeToString(sum[:]), html.EscapeString(fn))
		}
		fmt.Fprint(w, "</body></html>\n")
	})
	mux.HandleFunc("GET /files/{file}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := wheels[r.PathValue("file")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	})
	ix.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ix.requests.Add(1)
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(ix.srv.Close)
	if !strings.HasPrefix(ix.srv.URL, "http://127.0.0.1:") {
		t.Fatalf("the index is not on loopback: %s", ix.srv.URL)
	}
	return ix
}

// simpleURL is the index's URL for pip's --index-url.
func (ix *wheelIndex) simpleURL() string { return ix.srv.URL + "/simple" }

// testWheel builds the pure-Python wheel of project name (module
// name with '-' as '_') whose GREETING names the project and version.
func testWheel(name, version string) (filename string, content []byte) {
	mod := strings.ReplaceAll(name, "-", "_")
	return wheeltest.Filename(name, version), wheeltest.Build(name, version, map[string]string{
		mod + "/__init__.py": fmt.Sprintf("GREETING = 'hello from %s %s'\n", name, version),
	})
}

// writeTestWheel writes testWheel(name, version) into dir and returns its
// path.
func writeTestWheel(t testing.TB, dir, name, version string) string {
	t.Helper()
	fn, b := testWheel(name, version)
	p := filepath.Join(dir, fn)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
