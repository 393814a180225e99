// Package pipcache keeps a host-side, content-addressed wheel cache that
// sandboxes install from, read-only, with or without network. It is being
// built (see docs/ARCHITECTURE.md).
package pipcache
