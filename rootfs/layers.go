package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flmbox/flmbox/internal/flock"
)

// The layer store: layers/HEX holds layer sha256:HEX (its diff_id), stored
// once (storeLayer) and shared by every image that has it. Two locks guard
// a layer:
//
//	locks/layer-HEX.lock  exclusive while one process stores the layer
//	locks/layer-HEX.use   shared while a pull applies the layer to an
//	                      image it has not published yet; exclusive while
//	                      the layer is removed
//
// so that a layer is stored once however many pulls want it, and never
// removed between being stored and being named by a published image's
// record (Image.DiffIDs). A layer that no published image names is
// removed by the removal of the last image that named it, or by GC.

// layerInfo is the content of a stored layer's layer.json.
type layerInfo struct {
	DiffID string `json:"diff_id"`
	// SizeBytes is the content of its regular files.
	SizeBytes int64     `json:"size_bytes"`
	Created   time.Time `json:"created"`
}

const layerRecord = "layer.json"

func (s *Store) layerDir(hex string) string { return filepath.Join(s.dir, "layers", hex) }

func (s *Store) layerLockPath(hex, kind string) string {
	return filepath.Join(s.dir, "locks", "layer-"+hex+"."+kind)
}

// readLayer reads stored layer hex's record; it fails if the layer is not
// stored (or was damaged).
func (s *Store) readLayer(hex string) (*layerInfo, error) {
	var li layerInfo
	if err := readJSON(filepath.Join(s.layerDir(hex), layerRecord), &li); err != nil {
		return nil, err
	}
	return &li, nil
}

// useLayer takes layer hex's use lock, shared: the layer, if stored, stays
// until release is called.
func (s *Store) useLayer(ctx context.Context, hex string) (release func(), err error) {
	l, err := flock.LockFile(ctx, s.layerLockPath(hex, "use"), 0o600, flock.Shared)
	if err != nil {
		return nil, fmt.Errorf("lock layer sha256:%s: %w", hex, err)
	}
	return l.Unlock, nil
}

// storeLayerOnce stores layer hex with store unless it is stored, under
// the layer's store lock: one process stores it, the others wait and find
// it. store writes the layer into the staging directory it is given and
// returns its size once every digest matched; the directory is published
// only then. The caller holds the layer's use lock. cached reports whether
// the layer was already stored.
func (s *Store) storeLayerOnce(ctx context.Context, hex string, store func(staging string) (int64, error)) (cached bool, err error) {
	l, err := flock.LockFile(ctx, s.layerLockPath(hex, "lock"), 0o600, flock.Exclusive)
	if err != nil {
		return false, fmt.Errorf("lock layer sha256:%s: %w", hex, err)
	}
	defer l.Unlock()
	if _, err := s.readLayer(hex); err == nil {
		return true, nil
	}
	if exists(s.layerDir(hex)) {
		// Damaged (its record unreadable): stored again.
		if err := s.trashDir(s.layerDir(hex), "layer-"+hex); err != nil {
			return false, err
		}
	}
	// What a killed store of this layer left: ours to remove under the lock.
	s.removeLayerStaging(hex)
	staging, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), "layer-"+hex+"-")
	if err != nil {
		return false, fmt.Errorf("create staging directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(staging)
		}
	}()
	size, err := store(staging)
	if err != nil {
		return false, err
	}
	li := layerInfo{DiffID: "sha256:" + hex, SizeBytes: size, Created: time.Now().UTC()}
	if err := writeJSONAtomic(filepath.Join(staging, layerRecord), li); err != nil {
		return false, err
	}
	if err := os.Rename(staging, s.layerDir(hex)); err != nil {
		return false, fmt.Errorf("publish layer sha256:%s: %w", hex, err)
	}
	return false, nil
}

// removeLayerStaging removes what killed stores of layer hex left. The
// caller holds the layer's store lock.
func (s *Store) removeLayerStaging(hex string) {
	tmps, _ := os.ReadDir(filepath.Join(s.dir, "tmp"))
	for _, t := range tmps {
		if strings.HasPrefix(t.Name(), "layer-"+hex+"-") {
			_ = os.RemoveAll(filepath.Join(s.dir, "tmp", t.Name()))
		}
	}
}

// trashDir moves dir to trash under a name that starts with prefix, and
// deletes it.
func (s *Store) trashDir(dir, prefix string) error {
	trash, err := os.MkdirTemp(filepath.Join(s.dir, "trash"), prefix+"-")
	if err != nil {
		return err
	}
	if err := os.Rename(dir, filepath.Join(trash, "entry")); err != nil {
		_ = os.Remove(trash)
		return err
	}
	return os.RemoveAll(trash)
}

// layerUsers returns, for every stored layer that a published image names,
// how many images name it.
func (s *Store) layerUsers() map[string]int {
	users := map[string]int{}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "rootfs"))
	for _, e := range ents {
		img, err := s.get(e.Name())
		if err != nil {
			continue
		}
		for _, hex := range img.layers() {
			users[hex]++
		}
	}
	return users
}

// layers returns the hex of each of img's stored layers, once each.
func (img *Image) layers() []string {
	var out []string
	for _, d := range img.DiffIDs {
		if h, err := parseDigest(d); err == nil && !slices.Contains(out, h.Hex) {
			out = append(out, h.Hex)
		}
	}
	return out
}

// removeUnusedLayers removes the stored layers among hexes (every stored
// layer if hexes is nil) that no published image names and no pull is
// applying. It returns the bytes they held.
func (s *Store) removeUnusedLayers(hexes []string) (int64, error) {
	if hexes == nil {
		ents, _ := os.ReadDir(filepath.Join(s.dir, "layers"))
		for _, e := range ents {
			hexes = append(hexes, e.Name())
		}
	}
	// Each candidate's use lock first, then the images' records, read once:
	// a pull publishes an image naming a layer before it lets go of the
	// layer's use lock.
	locked := map[string]*flock.Lock{}
	defer func() {
		for _, l := range locked {
			l.Unlock()
		}
	}()
	for _, hex := range hexes {
		if _, err := parseDigest("sha256:" + hex); err != nil || !exists(s.layerDir(hex)) || locked[hex] != nil {
			continue
		}
		if l, err := flock.TryLockFile(s.layerLockPath(hex, "use"), 0o600, flock.Exclusive); err == nil {
			locked[hex] = l
		} // else a pull is applying it
	}
	if len(locked) == 0 {
		return 0, nil
	}
	users := s.layerUsers()
	var freed int64
	var errs []error
	for hex := range locked {
		if users[hex] > 0 {
			continue
		}
		var size int64
		if li, err := s.readLayer(hex); err == nil {
			size = li.SizeBytes
		} else {
			size = treeBytes(s.layerDir(hex))
		}
		if err := s.trashDir(s.layerDir(hex), "layer-"+hex); err != nil {
			errs = append(errs, fmt.Errorf("remove layer sha256:%s: %w", hex, err))
		} else {
			freed += size
		}
	}
	return freed, errors.Join(errs...)
}
