// Package integration holds flmbox's end-to-end tests. They need root, the
// real runsc and the real Python test image (internal/testrig/testimage), serve that
// image from an in-process registry on loopback, and run the flmbox binary.
// They are behind the build tag "integration": make integration runs them,
// and a missing piece fails them rather than skipping.
package integration
