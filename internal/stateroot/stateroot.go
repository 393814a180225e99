// Package stateroot is the layout of flmbox's state root (the CLI's
// --root), the one place that joins its parts:
//
//	ROOT/sandboxes/NAME    a sandbox's directory (packages sandbox and sandbox/record)
//	ROOT/images/           the image cache (package rootfs)
//	ROOT/pipcache/         the wheel cache (package pipcache)
//	ROOT/runsc/            runsc's state (its --root)
//	ROOT/pool/             the pools' settings and locks, SHAPE.*
//	ROOT/agents/ID/        a copy of each build of the agent that sandboxes bind
//	ROOT/logs/             runsc's logs of failed creations, NAME.create.log
//
// Each function returns its part of the state root root, which it neither
// makes nor checks.
package stateroot

import "path/filepath"

// Sandboxes is the directory of the sandboxes' directories.
func Sandboxes(root string) string { return filepath.Join(root, "sandboxes") }

// Sandbox is the directory of sandbox name. The name is not checked:
// record.Dir checks one that a caller gave.
func Sandbox(root, name string) string { return filepath.Join(root, "sandboxes", name) }

// Images is the image cache's directory.
func Images(root string) string { return filepath.Join(root, "images") }

// Pipcache is the wheel cache's directory.
func Pipcache(root string) string { return filepath.Join(root, "pipcache") }

// Runsc is runsc's state directory.
func Runsc(root string) string { return filepath.Join(root, "runsc") }

// Pool is the directory of the pools' settings and locks.
func Pool(root string) string { return filepath.Join(root, "pool") }

// Agents is the directory of the agent's copies.
func Agents(root string) string { return filepath.Join(root, "agents") }

// Logs is the directory of the logs of failed creations.
func Logs(root string) string { return filepath.Join(root, "logs") }
