// Package pipcache keeps a host-side wheel cache that sandboxes install
// Python packages from, read-only, with or without network.
//
// A Cache is a directory under the state root. Wheels enter it only
// through Add (files the operator gives) or AddInbox (what pip download
// left in an Inbox, from a sandbox), and only after Validate accepted a
// private copy of each: a wheel filename per the specification, a readable
// zip within Limits whose entries stay inside the tree, METADATA naming the
// filename's project and version, and a RECORD whose hashes match. Wheels
// are stored by sha256 and served as a flat directory of hard links
// (WheelsDir) that sandboxes mount read-only and that pip reads through
// --find-links (SandboxEnv).
package pipcache
