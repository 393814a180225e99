package runtime

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
)

// RunscEnv is the environment variable that names the runsc binary.
const RunscEnv = "FLMBOX_RUNSC"

// Sentinels of FindRunsc; errors.Is matches each of them and its kind.
var (
	// ErrRunscNotFound reports that the runsc named does not exist (or
	// cannot be examined), or that none is on PATH. It matches
	// errdefs.ErrNotFound.
	ErrRunscNotFound = errkind.Of(errdefs.ErrNotFound)
	// ErrRunscNotExecutable reports that the runsc named is a directory or
	// has no execute permission. It matches errdefs.ErrInvalidArgument.
	ErrRunscNotExecutable = errkind.Of(errdefs.ErrInvalidArgument)
)

// FindRunsc returns the runsc binary to use: path if it is not empty (the
// CLI's --runsc or FLMBOX_RUNSC), else "runsc" on PATH. It fails with
// ErrRunscNotFound or ErrRunscNotExecutable.
func FindRunsc(path string) (string, error) {
	if path != "" {
		fi, err := os.Stat(path)
		if err != nil {
			return "", fmt.Errorf("runsc %s: %w: %w", path, err, ErrRunscNotFound)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("runsc %s is not an executable file: %w", path, ErrRunscNotExecutable)
		}
		return path, nil
	}
	p, err := exec.LookPath("runsc")
	if err != nil {
		return "", fmt.Errorf("runsc is not on PATH: %w", ErrRunscNotFound)
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

// InspectRunsc runs `runsc --version` and `runsc flags`, each killed if it
// does not finish in seconds.
func InspectRunsc(ctx context.Context, runsc string) (*RunscInfo, error) {
	// go-runc's Version reads runc's words ("runc version"), and it has no
	// flags: both run beside it, bounded as it runs runsc.
	out, err := runOwn(ctx, runsc, "--version", nil, "--version")
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
	flags, err := os.CreateTemp("", "runsc-flags-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(flags.Name())
	defer flags.Close()
	// Old releases print flags with an error status, some on stderr.
	if _, err := runOwn(ctx, runsc, "flags", flags, "flags"); err != nil && (ctx.Err() != nil || errors.As(err, new(*TimeoutError))) {
		return nil, fmt.Errorf("run %s flags: %w", runsc, err)
	}
	b, _ := os.ReadFile(flags.Name())
	if m := defaultPlatformRE.FindSubmatch(b); m != nil {
		info.DefaultPlatform = string(m[1])
	} else {
		info.DefaultPlatform = "ptrace" // releases before systrap defaulted to ptrace
	}
	return info, nil
}
