// Package rootfs turns OCI images into unpacked root filesystems, cached on the
// local disk and shared read-only by every sandbox of a worker.
//
// An image is named by a registry reference (name[:tag], name@sha256:…) or by
// an OCI image layout on disk (oci-layout:PATH[@sha256:…]). [Store.Prewarm]
// resolves the name to an index, picks the manifest of the requested platform,
// verifies every digest it meets (manifests, config, each layer's compressed
// digest and its diff_id), and unpacks the layers in order into one directory
// tree per platform manifest. The pair (the digest the user named, platform) is
// remembered as an alias, so the next Prewarm by that digest is answered from
// the disk without a registry.
//
// Unpacking is done by [Unpacker], which treats the layers as hostile: every
// path is resolved inside the tree with chroot semantics (openat2
// RESOLVE_IN_ROOT), final path components are never followed, and sizes and
// entry counts are bounded.
//
// A Store can be told of mount points that every tree must have
// ([WithMountPoints], [PullOptions].MountPoints): a runtime that found one
// missing would make it in the tree that every sandbox shares. They are made
// after the last layer, before the entry is published, and recorded in the
// entry; an entry that lacks one gets it, recorded, under its lock, the only
// change ever made to a published tree. See docs/ARCHITECTURE.md for the
// on-disk layout.
package rootfs
