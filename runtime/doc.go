// Package runtime is flmbox's runsc driver: it finds runsc, builds the OCI
// runtime spec of a sandbox from composable SpecOpts, and runs, inspects and
// deletes runsc containers through go-runc. It knows nothing of sandboxes'
// names, records or directories: package sandbox owns those and hands it a
// bundle directory and a Container.
package runtime
