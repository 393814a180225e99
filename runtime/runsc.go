package runtime

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// RunscEnv is the environment variable that names the runsc binary.
const RunscEnv = "FLMBOX_RUNSC"

// FindRunsc returns the runsc binary to use: path if it is not empty (from
// --runsc or FLMBOX_RUNSC), else "runsc" on PATH.
func FindRunsc(path string) (string, error) {
	if path != "" {
		fi, err := os.Stat(path)
		if err != nil {
			return "", fmt.Errorf("runsc %s: %w; fix --runsc or %s, or run make runsc: %w", path, err, RunscEnv, errdefs.ErrNotFound)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("runsc %s is not an executable file; fix --runsc or %s: %w", path, RunscEnv, errdefs.ErrInvalidArgument)
		}
		return path, nil
	}
	p, err := exec.LookPath("runsc")
	if err != nil {
		return "", fmt.Errorf("runsc is not on PATH; install it with make runsc, or name it with --runsc or %s: %w", RunscEnv, errdefs.ErrNotFound)
	}
	return p, nil
}

// RunscInfo is what a runsc binary says about itself.
type RunscInfo struct {
	// Version is the first line of `runsc --version`.
	Version string `json:"version"`
	// DefaultPlatform is the gVisor platform runsc uses when none is given.
	DefaultPlatform string `json:"default_platform"`
}

var defaultPlatformRE = regexp.MustCompile(`(?s)-platform string\s.*?\(default "([a-z0-9]+)"\)`)

// InspectRunsc runs `runsc --version` and `runsc flags`.
func InspectRunsc(ctx context.Context, runsc string) (*RunscInfo, error) {
	out, err := exec.CommandContext(ctx, runsc, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("run %s --version: %w", runsc, err)
	}
	v := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	v = strings.TrimPrefix(v, "runsc version ")
	if v == "VERSION_MISSING" {
		// Built with go install: the module version is in the build info.
		if bi, err := buildinfo.ReadFile(runsc); err == nil {
			v = bi.Main.Path + "@" + bi.Main.Version
		}
	}
	info := &RunscInfo{Version: v}
	var flags bytes.Buffer
	cmd := exec.CommandContext(ctx, runsc, "flags")
	cmd.Stdout, cmd.Stderr = &flags, &flags
	_ = cmd.Run() // old releases print flags with an error status
	if m := defaultPlatformRE.FindSubmatch(flags.Bytes()); m != nil {
		info.DefaultPlatform = string(m[1])
	} else {
		info.DefaultPlatform = "ptrace" // releases before systrap defaulted to ptrace
	}
	return info, nil
}
