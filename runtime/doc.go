// Package runtime is flmbox's runsc driver: it finds runsc, builds the OCI
// runtime spec of a sandbox from composable SpecOpts, and runs, inspects and
// deletes runsc containers with runsc's commands, which it runs through
// github.com/containerd/go-runc. Every runsc command it runs is bounded and
// interruptible: runsc runs in a process group of its own, killed whole
// when its caller's context ends or its command's bound passes (a
// *TimeoutError). A gVisor platform this host cannot run is
// refused before runsc runs (ValidatePlatform, Platforms). It knows nothing
// of sandboxes' names, records or directories: package sandbox owns those
// and hands it a bundle directory and a Container.
package runtime
