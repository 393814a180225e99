package networld

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

// index is a PEP 503 "simple" index: /simple/ lists the projects,
// /simple/NAME/ a project's wheels with their sha256, /files/FILENAME
// serves a wheel.
type index struct {
	mu       sync.Mutex
	projects map[string][]string // normalized name -> filenames
	wheels   map[string][]byte   // by filename
}

func newIndex() *index {
	return &index{projects: map[string][]string{}, wheels: map[string][]byte{}}
}

// normalize is a project's name as PEP 503 writes it.
func normalize(name string) string {
	return strings.ToLower(regexp.MustCompile(`[-_.]+`).ReplaceAllString(name, "-"))
}

// AddWheel serves, on http://pypi.test/simple/, a pure-Python wheel of
// project name at version: its module (name with '-' as '_') holds
// GREETING = 'hello from NAME VERSION'. It returns the wheel's filename.
func (w *World) AddWheel(name, version string) string {
	mod := strings.ReplaceAll(name, "-", "_")
	fn := wheeltest.Filename(name, version)
	b := wheeltest.Build(name, version, map[string]string{
		mod + "/__init__.py": fmt.Sprintf("GREETING = 'hello from %s %s'\n", name, version),
	})
	ix := w.pypi
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if _, ok := ix.wheels[fn]; !ok {
		ix.projects[normalize(name)] = append(ix.projects[normalize(name)], fn)
	}
	ix.wheels[fn] = b
	return fn
}

// handler serves the index; other paths are left to next.
func (ix *index) handler(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/{$}", func(rw http.ResponseWriter, r *http.Request) {
		ix.mu.Lock()
		var names []string
		for p := range ix.projects {
			names = append(names, p)
		}
		ix.mu.Unlock()
		sort.Strings(names)
		fmt.Fprint(rw, "<!DOCTYPE html><html><body>\n")
		for _, p := range names {
			fmt.Fprintf(rw, "<a href=\"%s/\">%s</a>\n", p, p)
		}
		fmt.Fprint(rw, "</body></html>\n")
	})
	mux.HandleFunc("GET /simple/{project}/{$}", func(rw http.ResponseWriter, r *http.Request) {
		ix.mu.Lock()
		defer ix.mu.Unlock()
		files, ok := ix.projects[normalize(r.PathValue("project"))]
		if !ok {
			http.NotFound(rw, r)
			return
		}
		fmt.Fprint(rw, "<!DOCTYPE html><html><body>\n")
		for _, fn := range files {
			sum := sha256.Sum256(ix.wheels[fn])
			fmt.Fprintf(rw, "<a href=\"/files/%s#sha256=%s\">%s</a>\n", html.EscapeString(fn), hex.EncodeToString(sum[:]), html.EscapeString(fn))
		}
		fmt.Fprint(rw, "</body></html>\n")
	})
	mux.HandleFunc("GET /files/{file}", func(rw http.ResponseWriter, r *http.Request) {
		ix.mu.Lock()
		b, ok := ix.wheels[r.PathValue("file")]
		ix.mu.Unlock()
		if !ok {
			http.NotFound(rw, r)
			return
		}
		rw.Write(b)
	})
	mux.Handle("/", next)
	return mux
}
