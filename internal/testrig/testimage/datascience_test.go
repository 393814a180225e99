package testimage

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDataScienceRecipe: the data-science variant is the default recipe
// with the stack added, alone or with the test suite, each with a cache key
// of its own; the default image does not change.
func TestDataScienceRecipe(t *testing.T) {
	def := defaultRecipe()
	ds := recipeFor(Options{DataScience: true})
	both := recipeFor(Options{DataScience: true, Testsuite: true})
	if !slices.Equal(ds.Packages, slices.Concat(def.Packages, dataSciencePackages)) {
		t.Errorf("variant packages %q", ds.Packages)
	}
	if !slices.Equal(both.Packages, slices.Concat(testsuiteRecipe().Packages, dataSciencePackages)) {
		t.Errorf("variant with the test suite: packages %q", both.Packages)
	}
	for _, p := range []string{"python3-numpy", "python3-pandas", "python3-scipy", "python3-sklearn", "python3-matplotlib", "python3-pytest", "python3-hypothesis"} {
		if !slices.Contains(ds.Packages, p) {
			t.Errorf("the variant lacks %s", p)
		}
	}
	keys := map[string]bool{def.key(): true, testsuiteRecipe().key(): true, ds.key(): true, both.key(): true}
	if len(keys) != 4 {
		t.Errorf("%d cache keys for 4 recipes", len(keys))
	}
	if !slices.Equal(defaultRecipe().Packages, []string{"python3", "python3-pip"}) {
		t.Errorf("default packages %q: the default image must not change", defaultRecipe().Packages)
	}
	if err := ds.checkTree(t.TempDir()); err != nil {
		t.Errorf("the variant checks nothing more than the default: %v", err)
	}
	args := strings.Join(ds.debootstrapArgs("/t"), " ")
	if want := "--include=python3,python3-pip," + strings.Join(dataSciencePackages, ",") + " "; !strings.Contains(args, want) {
		t.Errorf("debootstrap args %q lack %q", args, want)
	}
}

// TestBuildDataScienceFromCache: Build with DataScience opens the variant's
// cache entry, not another.
func TestBuildDataScienceFromCache(t *testing.T) {
	cacheDir := t.TempDir()
	entry := packFakeRecipe(t, cacheDir, recipeFor(Options{DataScience: true}))
	var log bytes.Buffer
	img, err := Build(context.Background(), Options{CacheDir: cacheDir, DataScience: true, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if img.LayoutPath != filepath.Join(entry, "layout") || !strings.Contains(log.String(), "using "+img.LayoutPath) {
		t.Errorf("layout %s, log %q; want the cache entry %s used", img.LayoutPath, log.String(), entry)
	}
}
