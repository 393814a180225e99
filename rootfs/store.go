package rootfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/internal/flock"
	"github.com/flmbox/flmbox/internal/names"
)

// Store is the on-disk cache of unpacked images under one directory. Several
// processes may use one Store at once: every change of an entry happens under
// that entry's file lock, and every entry appears by an atomic rename.
//
// Layout (all directories 0700, files 0600):
//
//	rootfs/HEX/          one published entry per platform manifest sha256:HEX
//	    rootfs/          the unpacked tree, shared read-only by sandboxes:
//	                     its files are hard links to its layers' (layers/)
//	layers/HEX/          layer sha256:HEX (a diff_id), unpacked once and
//	                     shared by every image that has it (layers.go)
//	    image.json       Image metadata
//	    config.json      the image config, as served
//	    last-used        its mtime is the last time the entry was used
//	aliases/HEX/PLATFORM the named digest sha256:HEX (index or manifest) on
//	                     PLATFORM ("linux_amd64") is this manifest (JSON)
//	refs/KEY.json        the last digest a tag resolved to (for --offline)
//	leases/HEX/HOLDER    HOLDER (a sandbox) uses entry HEX: rm and gc keep it
//	locks/HEX.lock       flock(2) lock of entry HEX
//	tmp/HEX-RANDOM/      an entry being built; removed if its builder died
//	tmp/layer-HEX-RANDOM/ a layer being stored; likewise
//	trash/               entries and layers being removed
//
// A tree is what its image's layers make, plus the mount points that the
// Store was asked for (WithMountPoints, PullOptions.MountPoints), made after
// the last layer and recorded in image.json with every path made for them.
// Making a mount point that an entry's record lacks is the only change ever
// made to a published tree.
type Store struct {
	dir         string
	mountPoints []MountPoint
}

// Image describes a cached, unpacked image: one platform manifest.
type Image struct {
	// ManifestDigest is the platform manifest's digest.
	ManifestDigest string `json:"manifest_digest"`
	// Platform is the manifest's platform, "os/arch[/variant]".
	Platform string `json:"platform"`
	// ConfigDigest is the image config's digest.
	ConfigDigest string `json:"config_digest"`
	// Layers are the layers' compressed digests, bottom first.
	Layers []string `json:"layers"`
	// DiffIDs are the layers' diff_ids, bottom first: the stored layers
	// whose files the tree shares (none for an entry cached by an earlier
	// flmbox, whose tree has files of its own).
	DiffIDs []string `json:"diff_ids,omitempty"`
	// SizeBytes is the size of the regular files of the tree.
	SizeBytes int64 `json:"size_bytes"`
	// Created is when the tree was unpacked.
	Created time.Time `json:"created"`
	// MountPoints are the mount points the tree has been given (made after
	// its last layer, or found there with their type), sorted by path
	// within each preparation. An entry cached by an earlier flmbox has
	// none recorded.
	MountPoints []MountPoint `json:"mount_points,omitempty"`
	// Skipped are the optional mount points that the image has as another
	// type (MountPoint.Optional): nothing is to be mounted there.
	Skipped []MountPoint `json:"skipped_mount_points,omitempty"`
	// Moved are the optional mount points that the image has as a symlink
	// to a file or directory of its tree: made at the link's target (Moved).
	Moved []Moved `json:"moved_mount_points,omitempty"`
	// Added are the paths the Store created in the tree for MountPoints,
	// resolved in the tree, parents first: the mount points the image
	// lacked and their missing parents. They are all that the Store adds to
	// what the layers made; the directories they were made in keep their
	// times.
	Added []string `json:"added,omitempty"`
	// Rootfs is the unpacked tree's path (not stored; filled on read).
	Rootfs string `json:"rootfs"`
	// LastUsed is when a prewarm or a sandbox last used it (not stored).
	LastUsed time.Time `json:"last_used"`
	// Names are the references and digests that lead to it (not stored).
	Names []string `json:"names,omitempty"`
	// Holders are the leases' holders, e.g. sandbox names (not stored).
	Holders []string `json:"holders,omitempty"`
	// SharedBytes and UniqueBytes are what the image's layers hold on the
	// disk, as List found them: the layers other images have too, and
	// those only it has, which its removal would free (for an entry
	// cached by an earlier flmbox, SizeBytes). Not stored.
	SharedBytes int64 `json:"shared_bytes"`
	UniqueBytes int64 `json:"unique_bytes"`
}

// alias is the content of an alias file.
type alias struct {
	ManifestDigest string `json:"manifest_digest"`
	Platform       string `json:"platform"`
	// Name is the digest the alias is keyed by (index or manifest).
	Name string `json:"name"`
	// Ref is the repository (or layout) it was last pulled from, with
	// Name: "registry/repo@sha256:…" (none in an alias of an earlier
	// flmbox).
	Ref string `json:"ref,omitempty"`
}

// refRecord is the content of a refs file: a tag's last resolution.
type refRecord struct {
	Ref      string    `json:"ref"`
	Digest   string    `json:"digest"`
	Resolved time.Time `json:"resolved"`
}

// OpenStore opens (creating if needed) the image cache in dir. Invalid
// options fail with errdefs.ErrInvalidArgument.
func OpenStore(dir string, opts ...StoreOption) (*Store, error) {
	s := &Store{dir: dir}
	for _, opt := range opts {
		opt(s)
	}
	var err error
	if s.mountPoints, err = checkMountPoints(s.mountPoints); err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	for _, d := range []string{"", "rootfs", "layers", "aliases", "refs", "leases", "locks", "tmp", "trash"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	return s, nil
}

func (s *Store) entryDir(hex string) string { return filepath.Join(s.dir, "rootfs", hex) }
func (s *Store) aliasPath(hex string, p Platform) string {
	return filepath.Join(s.dir, "aliases", hex, p.key())
}

// refPath names a tag's refs file by the sha256 of the tag, so that no part
// of a user's string becomes a path.
func (s *Store) refPath(key string) string {
	return filepath.Join(s.dir, "refs", sha256Hash([]byte(key)).Hex[:32]+".json")
}

// get reads a published entry.
func (s *Store) get(hex string) (*Image, error) {
	dir := s.entryDir(hex)
	var img Image
	if err := readJSON(filepath.Join(dir, "image.json"), &img); err != nil {
		return nil, err
	}
	img.Rootfs = filepath.Join(dir, "rootfs")
	if fi, err := os.Stat(filepath.Join(dir, "last-used")); err == nil {
		img.LastUsed = fi.ModTime()
	}
	return &img, nil
}

// touch records a use of entry hex.
func (s *Store) touch(hex string) {
	now := time.Now()
	_ = os.Chtimes(filepath.Join(s.entryDir(hex), "last-used"), now, now)
}

// writeAlias records that (named, p) leads to img. Callers hold img's lock.
func (s *Store) writeAlias(named v1.Hash, ref string, p Platform, img *Image) error {
	a := alias{ManifestDigest: img.ManifestDigest, Platform: p.String(), Name: named.String(), Ref: ref}
	if err := writeJSONAtomic(s.aliasPath(named.Hex, p), a); err != nil {
		return fmt.Errorf("record alias %s (%s): %w", named, p, err)
	}
	return nil
}

// resolveAlias returns the entry that (named digest, platform) leads to.
func (s *Store) resolveAlias(named v1.Hash, p Platform) (*Image, error) {
	var a alias
	if err := readJSON(s.aliasPath(named.Hex, p), &a); err != nil {
		return nil, err
	}
	m, err := parseDigest(a.ManifestDigest)
	if err != nil {
		return nil, err
	}
	return s.get(m.Hex)
}

// Get returns the cached image that IMAGE (a digest reference, or a tag or
// layout with its last resolution) leads to on platform p, without any
// network access. It fails with ErrNotCached (errdefs.ErrNotFound) when it
// is not cached.
func (s *Store) Get(image string, p Platform) (*Image, error) {
	ref, err := ParseReference(image)
	if err != nil {
		return nil, err
	}
	named := ref.Digest
	if named.Hex == "" {
		if named, err = s.lastResolution(ref); err != nil {
			return nil, err
		}
	}
	img, err := s.resolveAlias(named, p)
	if err != nil {
		return nil, fmt.Errorf("image %s for %s is not cached: %w", image, p, ErrNotCached)
	}
	return img, nil
}

func (s *Store) lastResolution(ref Reference) (v1.Hash, error) {
	var rec refRecord
	if err := readJSON(s.refPath(ref.tagKey()), &rec); err != nil {
		return v1.Hash{}, fmt.Errorf("%s was never resolved on this worker: %w", ref, ErrNotCached)
	}
	return parseDigest(rec.Digest)
}

// List returns every cached image, most recently used first.
func (s *Store) List(ctx context.Context) ([]*Image, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "rootfs"))
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	names := s.names()
	var out []*Image
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		img, err := s.get(e.Name())
		if err != nil {
			continue // not an entry (or removed meanwhile)
		}
		img.Names = names[img.ManifestDigest]
		img.Holders, _ = s.holders(e.Name())
		out = append(out, img)
	}
	s.layerBytes(out)
	sort.Slice(out, func(i, j int) bool { return out[i].LastUsed.After(out[j].LastUsed) })
	return out, nil
}

// names maps manifest digests to the names that lead to them: tags and
// aliases' digests ("sha256:… (linux/amd64)").
func (s *Store) names() map[string][]string {
	out := map[string][]string{}
	byDigest := map[string][]string{} // named digest -> tags
	refs, _ := os.ReadDir(filepath.Join(s.dir, "refs"))
	for _, r := range refs {
		var rec refRecord
		if readJSON(filepath.Join(s.dir, "refs", r.Name()), &rec) == nil {
			byDigest[rec.Digest] = append(byDigest[rec.Digest], rec.Ref)
		}
	}
	s.walkAliases(func(_ string, a alias) {
		switch {
		case a.Ref != "":
			out[a.ManifestDigest] = append(out[a.ManifestDigest], a.Ref)
		case a.Name != a.ManifestDigest:
			out[a.ManifestDigest] = append(out[a.ManifestDigest], a.Name)
		}
		out[a.ManifestDigest] = append(out[a.ManifestDigest], byDigest[a.Name]...)
	})
	for d, names := range out {
		slices.Sort(names)
		out[d] = slices.Compact(names)
	}
	return out
}

// walkAliases calls fn for every readable alias file.
func (s *Store) walkAliases(fn func(path string, a alias)) {
	named, _ := os.ReadDir(filepath.Join(s.dir, "aliases"))
	for _, n := range named {
		plats, _ := os.ReadDir(filepath.Join(s.dir, "aliases", n.Name()))
		for _, p := range plats {
			if strings.HasPrefix(p.Name(), ".") {
				continue // a file being written
			}
			path := filepath.Join(s.dir, "aliases", n.Name(), p.Name())
			var a alias
			if readJSON(path, &a) == nil {
				fn(path, a)
			}
		}
	}
}

// Lease records that holder (a sandbox's name) uses the cached image with
// this manifest digest, so that Remove and GC keep it. Leases outlive the
// process; Release ends one. A holder has at most one lease on an image: a
// second Lease fails with errdefs.ErrAlreadyExists and leaves the first.
func (s *Store) Lease(ctx context.Context, manifestDigest, holder string) error {
	m, unlock, err := s.lockLease(ctx, manifestDigest, holder)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := s.get(m.Hex); err != nil {
		return fmt.Errorf("lease image %s: not cached: %w", manifestDigest, errdefs.ErrNotFound)
	}
	dir := filepath.Join(s.dir, "leases", m.Hex)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, holder), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("image %s is already leased by %s: %w", manifestDigest, holder, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("lease image %s: %w", manifestDigest, err)
	}
	s.touch(m.Hex)
	return f.Close()
}

// lockLease validates a lease's digest and holder and takes the entry's
// lock, which every change of its leases holds.
func (s *Store) lockLease(ctx context.Context, manifestDigest, holder string) (v1.Hash, func(), error) {
	m, err := parseDigest(manifestDigest)
	if err != nil {
		return v1.Hash{}, nil, err
	}
	if !names.Valid(holder, 128) {
		return v1.Hash{}, nil, fmt.Errorf("lease holder %q is not a valid name: %w", holder, errdefs.ErrInvalidArgument)
	}
	unlock, err := s.lock(ctx, m.Hex)
	if err != nil {
		return v1.Hash{}, nil, err
	}
	return m, unlock, nil
}

// Release ends holder's lease on the image; releasing a lease that does not
// exist is not an error.
func (s *Store) Release(ctx context.Context, manifestDigest, holder string) error {
	m, unlock, err := s.lockLease(ctx, manifestDigest, holder)
	if err != nil {
		return err
	}
	defer unlock()
	err = os.Remove(filepath.Join(s.dir, "leases", m.Hex, holder))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release lease: %w", err)
	}
	_ = os.Remove(filepath.Join(s.dir, "leases", m.Hex)) // only if empty
	return nil
}

func (s *Store) holders(hex string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "leases", hex))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}

// Removed describes an entry that Remove or GC deleted.
type Removed struct {
	ManifestDigest string `json:"manifest_digest"`
	// SizeBytes is what the removal freed: the content of the layers no
	// other image has, or of the tree of an entry cached by an earlier
	// flmbox.
	SizeBytes int64 `json:"size_bytes"`
	// Leftover, from GC, says what was removed that was no image: "an
	// interrupted pull" (its staging), "an interrupted removal".
	// ManifestDigest is empty then.
	Leftover string `json:"leftover,omitempty"`
}

// Remove deletes what IMAGE names: a manifest digest removes that entry, as
// does an ID, the start of its hex as `images ls` shows it (an ID that
// names no cached entry fails); an index digest, a digest reference or a
// tag removes every platform entry it leads to, and its aliases. Nothing
// cached under such a name is not an error (Remove is idempotent). An entry leased by a sandbox is kept and the call
// fails with ErrInUse (errdefs.ErrFailedPrecondition).
func (s *Store) Remove(ctx context.Context, image string) ([]Removed, error) {
	var named v1.Hash
	var tagPath string
	if h, err := parseDigest(image); err == nil {
		named = h
	} else if shortID.MatchString(image) {
		if named, err = s.byShortID(image); err != nil {
			return nil, err
		}
	} else {
		ref, err := ParseReference(image)
		if err != nil {
			return nil, err
		}
		named = ref.Digest
		if named.Hex == "" {
			tagPath = s.refPath(ref.tagKey())
			if named, err = s.lastResolution(ref); err != nil {
				return nil, nil // never resolved here: nothing to remove
			}
		}
	}
	targets := map[string]bool{}
	if _, err := os.Stat(s.entryDir(named.Hex)); err == nil {
		targets[named.Hex] = true
	}
	s.walkAliases(func(_ string, a alias) {
		if a.Name == named.String() {
			if m, err := parseDigest(a.ManifestDigest); err == nil {
				targets[m.Hex] = true
			}
		}
	})
	var removed []Removed
	var errs []error
	for hex := range targets {
		r, err := s.removeEntry(ctx, hex)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r != nil {
			removed = append(removed, *r)
		}
	}
	if len(errs) == 0 && tagPath != "" {
		_ = os.Remove(tagPath)
	}
	return removed, errors.Join(errs...)
}

// shortID is what `images ls` shows of a manifest digest, or any prefix of
// its hex, as docker takes an image ID.
var shortID = regexp.MustCompile(`^[0-9a-f]{1,64}$`)

// byShortID returns the manifest digest of the one cached entry whose hex
// starts with id; it fails with errdefs.ErrNotFound if none does, and
// errdefs.ErrInvalidArgument if several do.
func (s *Store) byShortID(id string) (v1.Hash, error) {
	ents, _ := os.ReadDir(filepath.Join(s.dir, "rootfs"))
	var found []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), id) {
			found = append(found, e.Name())
		}
	}
	switch len(found) {
	case 0:
		return v1.Hash{}, fmt.Errorf("no cached image has the ID %s: %w", id, errdefs.ErrNotFound)
	case 1:
		return parseDigest("sha256:" + found[0])
	}
	return v1.Hash{}, fmt.Errorf("the ID %s is the start of %d cached images' IDs: give more of it: %w", id, len(found), errdefs.ErrInvalidArgument)
}

// removeEntry deletes entry hex and every alias that leads to it, unless it
// is leased. A damaged entry (unreadable image.json) is removed too.
func (s *Store) removeEntry(ctx context.Context, hex string) (*Removed, error) {
	unlock, err := s.lock(ctx, hex)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.discard(hex)
}

// discard moves entry hex to trash, removes the aliases that led to it and
// deletes it, unless it is leased. The caller holds the entry's lock.
func (s *Store) discard(hex string) (*Removed, error) {
	if !exists(s.entryDir(hex)) {
		return nil, nil // already gone
	}
	r := &Removed{ManifestDigest: "sha256:" + hex}
	// The layers its removal may free: those it names, or any if its
	// record is damaged.
	var layers []string
	img, err := s.get(hex)
	if err == nil {
		r.SizeBytes = img.SizeBytes
		layers = img.layers()
	}
	if h, _ := s.holders(hex); len(h) > 0 {
		return nil, fmt.Errorf("image %s is used by %s: %w", r.ManifestDigest, strings.Join(h, ", "), ErrInUse)
	}
	trash, err := os.MkdirTemp(filepath.Join(s.dir, "trash"), hex+"-")
	if err != nil {
		return nil, fmt.Errorf("remove image %s: %w", r.ManifestDigest, err)
	}
	if err := os.Rename(s.entryDir(hex), filepath.Join(trash, "entry")); err != nil {
		return nil, fmt.Errorf("remove image %s: %w", r.ManifestDigest, err)
	}
	// Aliases go once the entry is gone; one left behind by a crash here
	// leads nowhere and is swept by GC.
	s.walkAliases(func(path string, a alias) {
		if a.ManifestDigest == r.ManifestDigest {
			_ = os.Remove(path)
		}
	})
	if err := os.RemoveAll(trash); err != nil {
		return nil, fmt.Errorf("remove image %s: delete its files: %w", r.ManifestDigest, err)
	}
	if img == nil || len(layers) > 0 {
		// Its tree's files were links: what is freed is the layers that no
		// other image has.
		freed, err := s.removeUnusedLayers(layers)
		if err != nil {
			return nil, fmt.Errorf("remove image %s: %w", r.ManifestDigest, err)
		}
		r.SizeBytes = freed
	}
	return r, nil
}

// GCOptions select what GC removes besides leftovers of interrupted pulls.
type GCOptions struct {
	// UnusedFor removes entries not used for this long (0: no such rule).
	UnusedFor time.Duration
	// MaxBytes, when not nil, removes least recently used entries until the
	// cache holds at most this many bytes.
	MaxBytes *int64
}

// GC removes leftovers of interrupted pulls and removals, aliases that lead
// nowhere, and the unleased entries that the options select.
func (s *Store) GC(ctx context.Context, o GCOptions) ([]Removed, error) {
	removed := s.cleanLeftovers()
	// Damaged entries (unreadable image.json).
	ents, _ := os.ReadDir(filepath.Join(s.dir, "rootfs"))
	for _, e := range ents {
		if _, err := s.get(e.Name()); err == nil {
			continue
		}
		if _, err := parseDigest("sha256:" + e.Name()); err != nil {
			continue
		}
		if r, err := s.removeEntry(ctx, e.Name()); err == nil && r != nil {
			removed = append(removed, *r)
		}
	}
	// Aliases that lead nowhere, checked again under the target's lock.
	s.walkAliases(func(path string, a alias) {
		m, err := parseDigest(a.ManifestDigest)
		if err != nil {
			_ = os.Remove(path)
			return
		}
		if exists(s.entryDir(m.Hex)) {
			return
		}
		if unlock, err := s.lock(ctx, m.Hex); err == nil {
			var again alias
			if readJSON(path, &again) == nil && again.ManifestDigest == a.ManifestDigest && !exists(s.entryDir(m.Hex)) {
				_ = os.Remove(path)
			}
			unlock()
		}
	})
	// Layers that no image has: a pull killed after storing them.
	if freed, err := s.removeUnusedLayers(nil); err != nil {
		return removed, err
	} else if freed > 0 {
		removed = append(removed, Removed{SizeBytes: freed, Leftover: "an interrupted pull"}) // its layers, stored
	}
	imgs, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	// Oldest use first.
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].LastUsed.Before(imgs[j].LastUsed) })
	total := s.diskBytes(imgs)
	inUse := 0
	for _, img := range imgs {
		old := o.UnusedFor > 0 && time.Since(img.LastUsed) > o.UnusedFor
		over := o.MaxBytes != nil && total > *o.MaxBytes
		if !(old || over) {
			continue
		}
		if len(img.Holders) > 0 {
			inUse++
			continue
		}
		m, _ := parseDigest(img.ManifestDigest)
		r, err := s.removeEntry(ctx, m.Hex)
		if err != nil {
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				continue // leased meanwhile
			}
			return removed, err
		}
		if r != nil {
			total -= r.SizeBytes
			removed = append(removed, *r)
		}
	}
	if o.MaxBytes != nil && total > *o.MaxBytes {
		return removed, &BudgetError{Bytes: total, MaxBytes: *o.MaxBytes, InUse: inUse}
	}
	return removed, nil
}

// layerBytes fills the SharedBytes and UniqueBytes of imgs, every cached
// image.
func (s *Store) layerBytes(imgs []*Image) {
	users := map[string]int{}
	layers := make([][]string, len(imgs))
	for i, img := range imgs {
		layers[i] = img.layers()
		for _, hex := range layers[i] {
			users[hex]++
		}
	}
	sizes := map[string]int64{}
	for hex := range users {
		if li, err := s.readLayer(hex); err == nil {
			sizes[hex] = li.SizeBytes
		}
	}
	for i, img := range imgs {
		if len(img.DiffIDs) == 0 {
			img.UniqueBytes = img.SizeBytes
			continue
		}
		for _, hex := range layers[i] {
			if users[hex] > 1 {
				img.SharedBytes += sizes[hex]
			} else {
				img.UniqueBytes += sizes[hex]
			}
		}
	}
}

// diskBytes is what the images imgs hold on the disk: the content of every
// stored layer once, and the trees of entries cached by an earlier flmbox.
func (s *Store) diskBytes(imgs []*Image) int64 {
	var n int64
	for _, img := range imgs {
		if len(img.DiffIDs) == 0 {
			n += img.SizeBytes
		}
	}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "layers"))
	for _, e := range ents {
		if li, err := s.readLayer(e.Name()); err == nil {
			n += li.SizeBytes
		}
	}
	return n
}

// BudgetError is GC's error when the cache holds more than GCOptions.MaxBytes
// once every image it could remove is gone: the rest are leased by
// sandboxes (InUse of them were over the budget). It is
// errdefs.ErrUnavailable: sandboxes are removed, and a later GC may meet it.
type BudgetError struct {
	Bytes, MaxBytes int64
	InUse           int
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("the image cache holds %s, over the %s asked for: %d image(s) in use by sandboxes are kept",
		units.BytesSize(float64(e.Bytes)), units.BytesSize(float64(e.MaxBytes)), e.InUse)
}

// Is makes a BudgetError errdefs.ErrUnavailable.
func (e *BudgetError) Is(target error) bool { return target == errdefs.ErrUnavailable }

// cleanLeftovers removes staging entries whose builder is gone and entries
// left in trash by an interrupted removal: both are named HEX-RANDOM and
// removed only while entry HEX's lock is free. It returns what it removed,
// with the bytes its files held.
func (s *Store) cleanLeftovers() []Removed {
	var removed []Removed
	for _, sub := range []string{"tmp", "trash"} {
		what := map[string]string{"tmp": "an interrupted pull", "trash": "an interrupted removal"}[sub]
		ents, _ := os.ReadDir(filepath.Join(s.dir, sub))
		for _, e := range ents {
			p := filepath.Join(s.dir, sub, e.Name())
			name, layer := strings.CutPrefix(e.Name(), "layer-")
			hex, _, _ := strings.Cut(name, "-")
			if _, err := parseDigest("sha256:" + hex); err != nil {
				_ = os.RemoveAll(p) // not ours to keep
				continue
			}
			lock := func() (func(), bool) { return s.tryLock(hex) }
			if layer {
				lock = func() (func(), bool) {
					l, err := flock.TryLockFile(s.layerLockPath(hex, "lock"), 0o600, flock.Exclusive)
					if err != nil {
						return nil, false
					}
					return l.Unlock, true
				}
			}
			if unlock, ok := lock(); ok {
				size := treeBytes(p)
				if os.RemoveAll(p) == nil {
					removed = append(removed, Removed{SizeBytes: size, Leftover: what})
				}
				unlock()
			}
		}
	}
	return removed
}

// treeBytes is what the regular files under p hold.
func treeBytes(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// removeStaging removes leftovers of earlier builds of entry hex. The caller
// holds the entry's lock, so no live builder owns them.
func (s *Store) removeStaging(hex string) {
	tmps, _ := os.ReadDir(filepath.Join(s.dir, "tmp"))
	for _, t := range tmps {
		if strings.HasPrefix(t.Name(), hex+"-") {
			_ = os.RemoveAll(filepath.Join(s.dir, "tmp", t.Name()))
		}
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func readJSON(p string, v any) error {
	b, err := readFileLimit(p, maxManifestBytes)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse %s: %w", p, err)
	}
	return nil
}

// writeJSONAtomic writes v to p through a temporary file in p's directory
// and a rename, so readers see the old or the new content, never a part.
func writeJSONAtomic(p string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(p, b, 0o600)
}

// Config returns the image config of the cached image with this manifest
// digest (its Env, User, WorkingDir…).
func (s *Store) Config(manifestDigest string) (*v1.ConfigFile, error) {
	m, err := parseDigest(manifestDigest)
	if err != nil {
		return nil, err
	}
	raw, err := readFileLimit(filepath.Join(s.entryDir(m.Hex), "config.json"), maxManifestBytes)
	if err != nil {
		return nil, fmt.Errorf("read the config of image %s: %w", manifestDigest, err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parse the config of image %s: %w", manifestDigest, err)
	}
	return cfg, nil
}
