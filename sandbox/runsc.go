package sandbox

import (
	"context"

	"github.com/flmbox/flmbox/runtime"
)

// Runsc describes a runsc binary, gVisor's runtime.
type Runsc struct {
	// Path is the binary's.
	Path string `json:"path"`
	// Version is the first line of `runsc --version`.
	Version string `json:"version"`
	// DefaultPlatform is the gVisor platform runsc uses when a Spec names
	// none.
	DefaultPlatform string `json:"default_platform"`
}

// LookupRunsc finds the runsc binary at path (if not empty) or else on
// PATH, and asks it its version and default platform (ErrRunscNotFound,
// ErrRunscNotExecutable, or a RunscTimeoutError if it does not answer).
func LookupRunsc(ctx context.Context, path string) (*Runsc, error) {
	p, err := runtime.FindRunsc(path)
	if err != nil {
		return nil, err
	}
	info, err := runtime.InspectRunsc(ctx, p)
	if err != nil {
		return nil, err
	}
	return &Runsc{Path: p, Version: info.Version, DefaultPlatform: info.DefaultPlatform}, nil
}

// Runsc describes the runsc the Manager runs (WithRunsc, else runsc on
// PATH).
func (m *Manager) Runsc(ctx context.Context) (*Runsc, error) { return LookupRunsc(ctx, m.o.runsc) }

// Platform is one of gVisor's platforms (Spec.Platform), and whether this
// host runs it.
type Platform struct {
	// Name is the platform's: systrap, ptrace or kvm.
	Name string `json:"name"`
	// Supported says whether this host can run it.
	Supported bool `json:"supported"`
	// Reason says why not, or what it needs that is there.
	Reason string `json:"reason"`
}

// Platforms returns gVisor's platforms, each said supported by this host or
// not, and why.
func Platforms() []Platform {
	var out []Platform
	for _, p := range runtime.Platforms() {
		out = append(out, Platform(p))
	}
	return out
}
