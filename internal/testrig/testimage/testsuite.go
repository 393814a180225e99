package testimage

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// The conformance variant (Options.Testsuite) adds CPython's regression
// tests, as Debian packages them, to the default recipe. bookworm's python3
// is 3.11, so its tests are libpython3.11-testsuite; the two come from one
// source package, and the build checks that their versions are equal.
const (
	// pythonPackage is the interpreter the tests are for.
	pythonPackage = "python3.11"
	// testsuitePackage holds CPython's tests, under /usr/lib/python3.11/test.
	testsuitePackage = "libpython3.11-testsuite"
)

// TestsuiteDir is where the conformance variant's tree has CPython's
// regression tests (the package test, run with python3 -m test), relative
// to the root.
const TestsuiteDir = "usr/lib/python3.11/test"

// testsuiteRecipe is the default recipe with testsuitePackage added.
func testsuiteRecipe() recipe {
	r := defaultRecipe()
	r.Packages = append(r.Packages, testsuitePackage)
	return r
}

// recipeFor is the recipe opts select: the default one, with the packages
// of each variant asked for.
func recipeFor(opts Options) recipe {
	r := defaultRecipe()
	if opts.Testsuite {
		r = testsuiteRecipe()
	}
	if opts.DataScience {
		r.Packages = append(r.Packages, dataSciencePackages...)
	}
	return r
}

// checkTree checks a debootstrapped tree of r before it is packed: with the
// test suite, that it is of the interpreter's version (tests of another
// release fail for reasons that have nothing to do with a sandbox).
func (r recipe) checkTree(rootfs string) error {
	if !slices.Contains(r.Packages, testsuitePackage) {
		return nil
	}
	return checkSameVersion(filepath.Join(rootfs, "var/lib/dpkg/status"), pythonPackage, testsuitePackage)
}

// checkSameVersion fails unless the installed packages a and b of the dpkg
// status file have the same version.
func checkSameVersion(statusFile, a, b string) error {
	f, err := os.Open(statusFile)
	if err != nil {
		return fmt.Errorf("check package versions: %w", err)
	}
	defer f.Close()
	v, err := installedVersions(f)
	if err != nil {
		return fmt.Errorf("check package versions: read %s: %w", statusFile, err)
	}
	for _, p := range []string{a, b} {
		if v[p] == "" {
			return fmt.Errorf("check package versions: %s is not installed (%s): %w", p, statusFile, errdefs.ErrNotFound)
		}
	}
	if v[a] != v[b] {
		return fmt.Errorf("check package versions: %s %s but %s %s; the mirror serves a mix of releases: %w",
			a, v[a], b, v[b], errdefs.ErrFailedPrecondition)
	}
	return nil
}

// installedVersions reads a dpkg status file (deb822 stanzas) and returns
// the version of each package whose status is "install ok installed".
func installedVersions(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	var pkg, version, status string
	flush := func() {
		if pkg != "" && version != "" && status == "install ok installed" {
			out[pkg] = version
		}
		pkg, version, status = "", "", ""
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20) // long Description and Conffiles lines
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch v = strings.TrimSpace(v); k {
		case "Package":
			pkg = v
		case "Version":
			version = v
		case "Status":
			status = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	flush()
	return out, nil
}
