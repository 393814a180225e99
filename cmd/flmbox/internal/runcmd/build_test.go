package runcmd

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/internal/testrig/testprog"
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

// TestSameBuild: a binary is of its own build (the test binary checked
// against its own file), and a file without build information is refused.
func TestSameBuild(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := SameBuild(self); err != nil {
		t.Fatalf("SameBuild of this binary: %v", err)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	testprog.Write(t, plain, []byte("#!/bin/sh\n"))
	if err := SameBuild(plain); err == nil {
		t.Fatal("a file without build information passed")
	}
}
