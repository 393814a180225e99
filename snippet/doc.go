// Package snippet runs code inside sandboxes: the resident agent that runs
// in every sandbox (flmbox agent) and the client that talks to it over a
// Unix socket. It is being built (see docs/ARCHITECTURE.md).
package snippet
