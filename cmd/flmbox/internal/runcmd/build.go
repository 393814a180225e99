package runcmd

import (
	"debug/buildinfo"
	"fmt"
	"runtime/debug"
)

// buildSettings are the build settings by which two binaries of one build
// must agree: the toolchain, the source (its VCS state, and the Makefile's
// -ldflags, which stamp a hash of the source), and how it was compiled.
var buildSettings = []string{"-ldflags", "-tags", "-trimpath", "CGO_ENABLED", "GOOS", "GOARCH",
	"vcs.revision", "vcs.time", "vcs.modified"}

// SameBuild fails unless the binary at path was built by the same build as
// this one. flmbox checks flmbox-core so, and flmbox-core checks flmbox-bench:
// they share their code (the record and client of a sandbox, run's flags,
// the output), and two binaries of two builds could disagree on any of it.
func SameBuild(path string) error {
	self, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("read this binary's build information")
	}
	other, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s's build information: %w", path, err)
	}
	if d := buildDiff(self, other); d != "" {
		return fmt.Errorf("%s is not of the same build as this flmbox (%s)", path, d)
	}
	return nil
}

// buildDiff names the first build setting by which a and b differ, or "".
func buildDiff(a, b *debug.BuildInfo) string {
	if a.GoVersion != b.GoVersion {
		return fmt.Sprintf("Go %s, not %s", b.GoVersion, a.GoVersion)
	}
	if a.Main.Path != b.Main.Path || a.Main.Version != b.Main.Version {
		return fmt.Sprintf("module %s@%s, not %s@%s", b.Main.Path, b.Main.Version, a.Main.Path, a.Main.Version)
	}
	for _, k := range buildSettings {
		if va, vb := setting(a, k), setting(b, k); va != vb {
			return fmt.Sprintf("%s %q, not %q", k, vb, va)
		}
	}
	return ""
}

func setting(bi *debug.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}
