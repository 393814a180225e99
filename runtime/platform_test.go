package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/flmbox/flmbox/internal/testrig/testprog"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// withHost points the platforms' checks at kvm and ptraceScope for the
// test's time.
func withHost(t *testing.T, kvm, scope string) {
	old, oldScope := kvmDevice, ptraceScope
	kvmDevice, ptraceScope = kvm, scope
	t.Cleanup(func() { kvmDevice, ptraceScope = old, oldScope })
}

func TestValidatePlatformNames(t *testing.T) {
	withHost(t, filepath.Join(t.TempDir(), "kvm"), filepath.Join(t.TempDir(), "ptrace_scope"))
	for _, p := range []string{"", "systrap", "ptrace"} {
		if err := ValidatePlatform(p); err != nil {
			t.Errorf("ValidatePlatform(%q): %v", p, err)
		}
	}
	for _, p := range []string{"xen", "Systrap", " kvm"} {
		if err := ValidatePlatform(p); !errdefs.IsInvalidArgument(err) || errors.Is(err, ErrPlatformUnsupported) {
			t.Errorf("ValidatePlatform(%q): %v, want an invalid name", p, err)
		}
	}
}

func TestKVMIsRefusedWithoutDevKVM(t *testing.T) {
	dir := t.TempDir()
	notKVM := filepath.Join(dir, "not-kvm")
	if err := os.WriteFile(notKVM, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, dev, says string }{
		{"absent", filepath.Join(dir, "kvm"), "no " + filepath.Join(dir, "kvm")},
		{"not a KVM device", notKVM, notKVM + " is not a KVM device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withHost(t, tc.dev, filepath.Join(dir, "ptrace_scope"))
			err := ValidatePlatform("kvm")
			if !errors.Is(err, ErrPlatformUnsupported) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("ValidatePlatform(kvm): %v, want ErrPlatformUnsupported", err)
			}
			msg := err.Error()
			for _, want := range []string{"gVisor platform kvm cannot run on this host", tc.says, "this host runs systrap, ptrace"} {
				if !strings.Contains(msg, want) {
					t.Errorf("%q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("%q is more than one line", msg)
			}
			ps := Platforms()
			if len(ps) != 3 || !ps[0].Supported || !ps[1].Supported || ps[2].Name != "kvm" || ps[2].Supported || !strings.Contains(ps[2].Reason, tc.says) {
				t.Errorf("Platforms: %+v", ps)
			}

			// Run and Restore refuse it before runsc runs.
			ran := filepath.Join(dir, "ran")
			runsc := filepath.Join(dir, "runsc")
			testprog.Write(t, runsc, []byte("#!/bin/sh\ntouch "+ran+"\n"))
			r, err := NewRuntime(runsc, filepath.Join(dir, "root"))
			if err != nil {
				t.Fatal(err)
			}
			c := Container{ID: "flmbox-0123", Network: NetworkNone, Platform: "kvm"}
			bundle := t.TempDir()
			if _, err := r.Run(context.Background(), c, bundle, &specs.Spec{}, nil); !errors.Is(err, ErrPlatformUnsupported) {
				t.Errorf("Run: %v", err)
			}
			if _, err := r.Restore(context.Background(), c, bundle, t.TempDir(), nil); !errors.Is(err, ErrPlatformUnsupported) {
				t.Errorf("Restore: %v", err)
			}
			if _, err := os.Stat(ran); err == nil {
				t.Error("runsc ran")
			}
		})
	}
}

func TestPtraceScope3(t *testing.T) {
	scope := filepath.Join(t.TempDir(), "ptrace_scope")
	if err := os.WriteFile(scope, []byte("3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withHost(t, filepath.Join(t.TempDir(), "kvm"), scope)
	err := ValidatePlatform("ptrace")
	if !errors.Is(err, ErrPlatformUnsupported) || !strings.Contains(err.Error(), "ptrace_scope is 3") || !strings.Contains(err.Error(), "this host runs systrap)") {
		t.Errorf("ValidatePlatform(ptrace): %v", err)
	}
}

func TestKVMOnThisHost(t *testing.T) {
	// /dev/kvm as this host has it: the check agrees with opening it.
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err == nil {
		f.Close()
	}
	if got := ValidatePlatform("kvm"); (err == nil) != (got == nil) {
		t.Errorf("open /dev/kvm: %v; ValidatePlatform(kvm): %v", err, got)
	}
}
