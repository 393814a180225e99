// Package testimage builds, once per machine, a real Python image for tests
// and demos, and keeps it as an OCI image layout in a cache directory.
//
// The image is a Debian bookworm minbase tree with python3 and python3-pip,
// made with debootstrap (about a minute, root needed) and packed by this
// package's own tar writer into an image index with two platforms:
//
//   - linux/amd64: the tree in three layers. Layer 1 (gzip) holds everything
//     except /usr/lib/python3* and /usr/share, plus fixtures; layer 2 (gzip)
//     holds /usr/lib/python3* and /usr/share; layer 3 (zstd) deletes a
//     fixture with a whiteout, replaces a directory with an opaque whiteout
//     and adds a setuid file, a hardlink pair, a symlink and a sticky
//     directory. The constants of this package name those fixtures, so that
//     tests can check an unpacked tree against them.
//   - linux/arm64: a tiny placeholder with one file, for platform selection.
//
// A variant for the conformance suite (Options.Testsuite, built on demand)
// adds Debian's libpython3.11-testsuite, CPython's own regression tests for
// the image's python3.11, of the same version (the build checks it), and is
// packed the same way; it has a cache entry of its own. So has the
// data-science variant (Options.DataScience): Debian's numpy, pandas, scipy,
// scikit-learn, matplotlib, OpenBLAS, pytest and hypothesis, with the
// libraries' own tests.
//
// The cache is keyed by a hash of the recipe (suite, variant, architecture,
// packages, mirror and a version of the layer split) and laid out as
//
//	CacheDir/<key>/rootfs   the cleaned debootstrap tree
//	CacheDir/<key>/layout   the OCI image layout
//	CacheDir/<key>.lock     flock(2) taken while building
//
// A build runs in a temporary directory inside CacheDir that is renamed to
// <key> only when complete, so a crashed build leaves nothing that a later
// Build uses; the next build removes its leftovers. Once built, [Build] only
// reads the layout (milliseconds) and needs no root.
package testimage
