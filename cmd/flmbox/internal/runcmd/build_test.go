package runcmd

import (
	"debug/buildinfo"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// TestBuildDiff: two binaries of one build agree; any difference in the
// toolchain, the module, the source's stamp or VCS state is named.
func TestBuildDiff(t *testing.T) {
	base := func() *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/flmbox/flmbox", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "-ldflags", Value: "-X x.Build=abc"}, {Key: "vcs.revision", Value: "f00"}, {Key: "vcs.modified", Value: "false"}}}
	}
	if d := buildDiff(base(), base()); d != "" {
		t.Fatalf("one build: %q", d)
	}
	for _, tc := range []struct {
		name string
		edit func(*debug.BuildInfo)
		want string
	}{
		{"toolchain", func(b *debug.BuildInfo) { b.GoVersion = "go1.25.0" }, "Go go1.25.0"},
		{"stamp", func(b *debug.BuildInfo) { b.Settings[0].Value = "-X x.Build=def" }, "-ldflags"},
		{"revision", func(b *debug.BuildInfo) { b.Settings[1].Value = "bar" }, "vcs.revision"},
		{"a setting missing", func(b *debug.BuildInfo) { b.Settings = b.Settings[:2] }, "vcs.modified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := base()
			tc.edit(other)
			if d := buildDiff(base(), other); !strings.Contains(d, tc.want) {
				t.Fatalf("buildDiff = %q, want it to name %q", d, tc.want)
			}
		})
	}
}

// TestReadBuildInfo: the build information read from a binary's file is
// what debug/buildinfo reads (the test binary compared with itself), and a
// file without any is refused.
func TestReadBuildInfo(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	got, err := readBuildInfo(self)
	if err != nil {
		t.Fatal(err)
	}
	want, err := buildinfo.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Fatalf("read\n%s\nwant\n%s", got, want)
	}
	if d := buildDiff(want, got); d != "" {
		t.Fatalf("buildDiff of one binary: %s", d)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o755)
	if _, err := readBuildInfo(plain); err == nil {
		t.Fatal("a file without build information was read")
	}
}
