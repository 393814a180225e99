package runtime

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"golang.org/x/sys/unix"
)

// ErrPlatformUnsupported reports a gVisor platform that this host cannot
// run (kvm without a usable /dev/kvm). It matches errdefs.ErrInvalidArgument:
// another platform must be chosen.
var ErrPlatformUnsupported = errkind.Of(errdefs.ErrInvalidArgument)

// platformNames are gVisor's platforms, runsc's default first.
var platformNames = []string{"systrap", "ptrace", "kvm"}

// Host files the platforms' checks read; tests point them elsewhere.
var (
	kvmDevice   = "/dev/kvm"
	ptraceScope = "/proc/sys/kernel/yama/ptrace_scope"
)

// Platform says whether this host can run a gVisor platform.
type Platform struct {
	// Name is the platform's: systrap, ptrace or kvm.
	Name string `json:"name"`
	// Supported says whether this host can run it.
	Supported bool `json:"supported"`
	// Reason says why not, or what it needs that is there.
	Reason string `json:"reason"`
}

// Platforms returns, for each gVisor platform, whether this host can run
// it: systrap always; ptrace unless Yama forbids every ptrace
// (kernel.yama.ptrace_scope 3); kvm only if /dev/kvm opens read-write and
// answers as KVM does (a host without hardware virtualization, or a VM not
// given nested virtualization, has none: runsc with --platform=kvm then
// fails, or hangs). Each check takes microseconds.
func Platforms() []Platform {
	out := make([]Platform, 0, len(platformNames))
	for _, n := range platformNames {
		out = append(out, platform(n))
	}
	return out
}

// platform says whether this host can run platform n, one of platformNames.
func platform(n string) Platform {
	p := Platform{Name: n, Supported: true}
	switch n {
	case "systrap":
		p.Reason = "needs seccomp, which every supported kernel has"
	case "ptrace":
		p.Reason = "needs ptrace"
		if b, err := os.ReadFile(ptraceScope); err == nil && strings.TrimSpace(string(b)) == "3" {
			p.Supported, p.Reason = false, "kernel.yama.ptrace_scope is 3: no process may ptrace"
		}
	case "kvm":
		if err := checkKVM(); err != nil {
			p.Supported, p.Reason = false, err.Error()
		} else {
			p.Reason = kvmDevice + " is usable"
		}
	}
	return p
}

// KVM's ioctl KVM_GET_API_VERSION (_IO(0xAE, 0x00), linux/kvm.h) and what
// it returns on every kernel since 2.6.22.
const (
	kvmGetAPIVersion = 0xAE00
	kvmAPIVersion    = 12
)

// checkKVM says why kvmDevice cannot serve gVisor's kvm platform, or nil.
func checkKVM() error {
	f, err := os.OpenFile(kvmDevice, os.O_RDWR, 0)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no %s (this host has no hardware virtualization, or does not give it to this VM)", kvmDevice)
	case err != nil:
		return err // open /dev/kvm: permission denied...
	}
	defer f.Close()
	v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion)
	if err != nil || v != kvmAPIVersion {
		return fmt.Errorf("%s is not a KVM device", kvmDevice)
	}
	return nil
}

// ValidatePlatform checks that p names a gVisor platform ("" is runsc's
// default) and that this host can run it (see Platforms): runsc given a
// platform it cannot run fails, or hangs, where this refuses at once. A
// name that is none of systrap, ptrace or kvm is errdefs.ErrInvalidArgument;
// one this host cannot run is ErrPlatformUnsupported.
func ValidatePlatform(p string) error {
	switch {
	case p == "":
		return nil
	case !slices.Contains(platformNames, p):
		return fmt.Errorf("gVisor platform %q: want systrap, ptrace or kvm: %w", p, errdefs.ErrInvalidArgument)
	}
	this := platform(p)
	if this.Supported {
		return nil
	}
	var can []string
	for _, pl := range Platforms() {
		if pl.Supported {
			can = append(can, pl.Name)
		}
	}
	return fmt.Errorf("gVisor platform %s cannot run on this host (%s; this host runs %s): %w", p, this.Reason, strings.Join(can, ", "), ErrPlatformUnsupported)
}
