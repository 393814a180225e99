package rootfs

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Platform is a normalised OS/architecture/variant triple. Normalisation
// follows containerd's platforms package: "x86_64" is "amd64", "aarch64" and
// "arm64/v8" are "arm64", a bare "arm" is "arm/v7", and "amd64/v1" is "amd64".
type Platform struct {
	OS           string
	Architecture string
	Variant      string
}

// HostPlatform returns the platform of the running worker.
func HostPlatform() Platform {
	p := Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
	return p.normalize()
}

// ParsePlatform parses "os/arch[/variant]" and normalises it.
func ParsePlatform(s string) (Platform, error) {
	parts := strings.Split(strings.ToLower(s), "/")
	if len(parts) < 2 || len(parts) > 3 {
		return Platform{}, fmt.Errorf("parse platform %q: want os/arch[/variant], for example linux/amd64: %w", s, errdefs.ErrInvalidArgument)
	}
	for _, p := range parts {
		if !validPlatformPart(p) {
			return Platform{}, fmt.Errorf("parse platform %q: %q is not a valid part (letters, digits, '.', '_', '-', starting with a letter or digit): %w", s, p, errdefs.ErrInvalidArgument)
		}
	}
	p := Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p.normalize(), nil
}

func validPlatformPart(s string) bool {
	if s == "" || len(s) > 32 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (p Platform) normalize() Platform {
	p.OS = strings.ToLower(p.OS)
	switch strings.ToLower(p.Architecture) {
	case "x86_64", "x86-64", "amd64":
		p.Architecture = "amd64"
		if p.Variant == "v1" {
			p.Variant = ""
		}
	case "aarch64", "arm64":
		p.Architecture = "arm64"
		if p.Variant == "v8" || p.Variant == "8" {
			p.Variant = ""
		}
	case "armhf":
		p.Architecture, p.Variant = "arm", "v7"
	case "armel":
		p.Architecture, p.Variant = "arm", "v6"
	case "arm":
		switch p.Variant {
		case "", "7":
			p.Variant = "v7"
		case "5", "6", "8":
			p.Variant = "v" + p.Variant
		}
	case "i386", "i686", "386":
		p.Architecture = "386"
	default:
		p.Architecture = strings.ToLower(p.Architecture)
	}
	return p
}

// String returns "os/arch" or "os/arch/variant".
func (p Platform) String() string {
	if p.Variant == "" {
		return p.OS + "/" + p.Architecture
	}
	return p.OS + "/" + p.Architecture + "/" + p.Variant
}

// key is the platform as a file name: "linux_amd64", "linux_arm_v7".
func (p Platform) key() string {
	return strings.ReplaceAll(p.String(), "/", "_")
}

// matches reports whether an index entry's or config's platform is p.
func (p Platform) matches(o v1.Platform) bool {
	return Platform{OS: o.OS, Architecture: o.Architecture, Variant: o.Variant}.normalize() == p
}

// RunsOn reports whether an image of platform p runs on a worker of
// platform host: the same OS and architecture (any variant).
func (p Platform) RunsOn(host Platform) bool {
	p, host = p.normalize(), host.normalize()
	return p.OS == host.OS && p.Architecture == host.Architecture
}
