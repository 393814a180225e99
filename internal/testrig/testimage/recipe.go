package testimage

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// recipeVersion names the layer split and the fixtures. Bump it whenever the
// layout made from the same debootstrap tree changes, so that caches built by
// older code are not used.
const recipeVersion = 1

// defaultMirror is used when the machine's apt sources name no Debian mirror
// for the suite.
const defaultMirror = "http://deb.debian.org/debian"

// recipe is everything that decides the content of the image. Its hash is
// the cache key.
type recipe struct {
	Version  int      `json:"version"`
	Suite    string   `json:"suite"`
	Variant  string   `json:"variant"`
	Arch     string   `json:"arch"`
	Packages []string `json:"packages"`
	Mirror   string   `json:"mirror"`
}

// defaultRecipe is bookworm minbase with python3 and pip, for amd64, from
// the mirror of the machine's apt sources.
func defaultRecipe() recipe {
	const suite = "bookworm"
	return recipe{
		Version:  recipeVersion,
		Suite:    suite,
		Variant:  "minbase",
		Arch:     "amd64",
		Packages: []string{"python3", "python3-pip"},
		Mirror:   aptMirror("/etc/apt", suite),
	}
}

// key is the first 16 hex digits of the SHA-256 of the recipe.
func (r recipe) key() string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a struct of strings always marshals
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// debootstrapArgs are the arguments that build the recipe into target.
func (r recipe) debootstrapArgs(target string) []string {
	return []string{
		"--variant=" + r.Variant,
		"--arch=" + r.Arch,
		"--include=" + strings.Join(r.Packages, ","),
		r.Suite, target, r.Mirror,
	}
}

// aptMirror returns the first http(s) URI of a "deb" source for suite in
// the apt configuration directory dir (sources.list, then sources.list.d in
// name order, one-line and deb822 formats), or defaultMirror.
func aptMirror(dir, suite string) string {
	files := []string{filepath.Join(dir, "sources.list")}
	extra, _ := filepath.Glob(filepath.Join(dir, "sources.list.d", "*"))
	slices.Sort(extra)
	files = append(files, extra...)
	for _, name := range files {
		var parse func(io.Reader, string) string
		switch {
		case strings.HasSuffix(name, ".sources"):
			parse = mirrorFromDeb822
		case strings.HasSuffix(name, ".list"):
			parse = mirrorFromList
		default:
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		m := parse(f, suite)
		f.Close()
		if m != "" {
			return m
		}
	}
	return defaultMirror
}

// mirrorFromList parses the one-line format: deb [options] uri suite comp...
func mirrorFromList(r io.Reader, suite string) string {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options: [ a=b c=d ]
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 && f[1] == suite && isHTTP(f[0]) {
			return strings.TrimSuffix(f[0], "/")
		}
	}
	return ""
}

// mirrorFromDeb822 parses the deb822 format: stanzas with Types, URIs and
// Suites fields, separated by blank lines.
func mirrorFromDeb822(r io.Reader, suite string) string {
	sc := bufio.NewScanner(r)
	stanza := map[string][]string{}
	check := func() string {
		defer clear(stanza)
		if !slices.Contains(stanza["types"], "deb") || !slices.Contains(stanza["suites"], suite) {
			return ""
		}
		if enabled := stanza["enabled"]; len(enabled) > 0 && enabled[0] == "no" {
			return ""
		}
		for _, u := range stanza["uris"] {
			if isHTTP(u) {
				return strings.TrimSuffix(u, "/")
			}
		}
		return ""
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			if m := check(); m != "" {
				return m
			}
			continue
		}
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			continue // comments and continuation lines (Signed-By keys)
		}
		k, v, ok := strings.Cut(line, ":")
		if ok {
			stanza[strings.ToLower(strings.TrimSpace(k))] = strings.Fields(v)
		}
	}
	return check()
}

func isHTTP(uri string) bool {
	return strings.HasPrefix(uri, "http://") || strings.HasPrefix(uri, "https://")
}
