package testimage

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestTestsuiteRecipe(t *testing.T) {
	def, suite := defaultRecipe(), testsuiteRecipe()
	if !slices.Equal(def.Packages, []string{"python3", "python3-pip"}) {
		t.Errorf("default packages %q: the default image must not change", def.Packages)
	}
	if !slices.Equal(suite.Packages, []string{"python3", "python3-pip", testsuitePackage}) {
		t.Errorf("variant packages %q", suite.Packages)
	}
	if def.key() == suite.key() {
		t.Error("the variant has the default image's cache key")
	}
	tests := []struct {
		opts Options
		want recipe
	}{
		{Options{}, def},
		{Options{CacheDir: "/x"}, def},
		{Options{Testsuite: true}, suite},
	}
	for _, tt := range tests {
		if got := recipeFor(tt.opts); got.key() != tt.want.key() {
			t.Errorf("recipeFor(%+v) has packages %q, want %q", tt.opts, got.Packages, tt.want.Packages)
		}
	}
	args := strings.Join(suite.debootstrapArgs("/t"), " ")
	if want := "--include=python3,python3-pip," + testsuitePackage + " "; !strings.Contains(args, want) {
		t.Errorf("debootstrap args %q lack %q", args, want)
	}
}

// status is a dpkg status file's stanza.
func status(pkg, state, version string) string {
	return "Package: " + pkg + "\nStatus: " + state + "\nPriority: optional\nVersion: " + version +
		"\nDescription: a package\n long description\n .\n more\n\n"
}

func TestCheckSameVersion(t *testing.T) {
	const ok = "install ok installed"
	tests := []struct {
		name, status string
		err          func(error) bool // nil: no error
	}{
		{"same", status(pythonPackage, ok, "3.11.2-6+deb12u8") + status(testsuitePackage, ok, "3.11.2-6+deb12u8"), nil},
		{"same, no trailing blank line", status(testsuitePackage, ok, "3.11.2-6") + strings.TrimSpace(status(pythonPackage, ok, "3.11.2-6")), nil},
		{"different", status(pythonPackage, ok, "3.11.2-6+deb12u8") + status(testsuitePackage, ok, "3.11.2-6+deb12u9"), errdefs.IsFailedPrecondition},
		{"testsuite missing", status(pythonPackage, ok, "3.11.2-6"), errdefs.IsNotFound},
		{"testsuite removed", status(pythonPackage, ok, "3.11.2-6") + status(testsuitePackage, "deinstall ok config-files", "3.11.2-6"), errdefs.IsNotFound},
		{"python missing", status(testsuitePackage, ok, "3.11.2-6"), errdefs.IsNotFound},
		{"empty", "", errdefs.IsNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "status")
			if err := os.WriteFile(p, []byte(tt.status), 0o644); err != nil {
				t.Fatal(err)
			}
			err := checkSameVersion(p, pythonPackage, testsuitePackage)
			switch {
			case tt.err == nil && err != nil:
				t.Errorf("checkSameVersion: %v, want nil", err)
			case tt.err != nil && (err == nil || !tt.err(err)):
				t.Errorf("checkSameVersion: %v, want an error of the kind tested", err)
			}
		})
	}
	if err := checkSameVersion(filepath.Join(t.TempDir(), "none"), pythonPackage, testsuitePackage); err == nil {
		t.Error("no status file: nil error")
	}
}

func TestCheckTree(t *testing.T) {
	root := t.TempDir()
	if err := defaultRecipe().checkTree(root); err != nil {
		t.Errorf("default recipe checks nothing, got %v", err)
	}
	if err := testsuiteRecipe().checkTree(root); err == nil {
		t.Error("variant without a dpkg status: nil error")
	}
	p := filepath.Join(root, "var/lib/dpkg/status")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	const ok = "install ok installed"
	if err := os.WriteFile(p, []byte(status(pythonPackage, ok, "1")+status(testsuitePackage, ok, "1")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := testsuiteRecipe().checkTree(root); err != nil {
		t.Errorf("variant: %v", err)
	}
}

// TestBuildTestsuiteFromCache: Build with Testsuite opens the variant's
// cache entry, not the default image's.
func TestBuildTestsuiteFromCache(t *testing.T) {
	cacheDir := t.TempDir()
	entry := packFakeRecipe(t, cacheDir, testsuiteRecipe())
	var log bytes.Buffer
	img, err := Build(context.Background(), Options{CacheDir: cacheDir, Testsuite: true, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if img.LayoutPath != filepath.Join(entry, "layout") || !strings.Contains(log.String(), "using "+img.LayoutPath) {
		t.Errorf("layout %s, log %q; want the cache entry %s used", img.LayoutPath, log.String(), entry)
	}
	if _, err := os.Stat(filepath.Join(cacheDir, defaultRecipe().key())); err == nil {
		t.Error("the default image's entry appeared")
	}
}
