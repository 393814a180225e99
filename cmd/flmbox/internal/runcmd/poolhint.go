package runcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/internal/stateroot"
)

// Pool hints.
//
// The flmbox command takes a sandbox from a warm pool for `run --image
// IMAGE` itself, without flmbox-core, when it knows the pool's shape. A
// shape is the image's manifest and a sandbox's settings with their
// defaults (package sandbox), which only flmbox-core can work out; so
// flmbox-core, once it has run such a command line, writes a hint:
// ROOT/pool/hints/KEY holds the shape of the sandboxes that IMAGE and
// --tmp-size make, KEY naming the command line (PoolHintKey). The flmbox
// command reads it and adopts an idle sandbox of that shape as package
// sandbox does; with no hint, or no idle sandbox, it hands the command line
// to flmbox-core. A hint is written only for a digest reference (its
// manifest cannot change) and only for a shape that has a pool; the key
// holds this build and the flmbox-core and agent binaries (each by size and
// modification time), so a hint never names the shape of another flmbox
// (whose defaults may differ) or agent. A pool drained since leaves a hint whose shape has no
// idle sandbox: flmbox-core runs the command.

// PoolHintable reports whether image is a digest reference, the images
// whose command lines get pool hints.
func PoolHintable(image string) bool { return strings.Contains(image, "@sha256:") }

// PoolHintKey names the command line `run --image image --tmp-size
// tmpSize` (tmpSize as given, "" if it is not) run by this build with the
// flmbox-core and agent binaries that core and agent describe (FileID).
func PoolHintKey(image, tmpSize, core, agent string) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{"1", Build, core, agent, image, tmpSize}, "\x00")))
	return hex.EncodeToString(sum[:12])
}

// FileID describes the binary at path by its size and modification time,
// as a sandbox's shape describes its agent; "" if it cannot be read.
func FileID(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d-%d", fi.Size(), fi.ModTime().UnixNano())
}

func poolHintPath(root, key string) string {
	return filepath.Join(stateroot.Pool(root), "hints", key)
}

// ReadPoolHint returns the shape the hint key names, "" if there is none.
func ReadPoolHint(root, key string) string {
	b, err := os.ReadFile(poolHintPath(root, key))
	if err != nil || len(b) == 0 || len(b) > 64 || strings.ContainsAny(string(b), "/\n") {
		return ""
	}
	return string(b)
}

// WritePoolHint makes the hint key name shape, unless it does already.
func WritePoolHint(root, key, shape string) error {
	if ReadPoolHint(root, key) == shape {
		return nil
	}
	p := poolHintPath(root, key)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(p, []byte(shape), 0o600)
}
