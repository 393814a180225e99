// Package runtime runs sandboxes on gVisor's runsc: it finds runsc, builds
// the OCI runtime spec of a sandbox and drives runsc's lifecycle.
package runtime
