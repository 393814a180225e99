package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/readahead"
	"golang.org/x/sync/errgroup"
)

// DefaultJobs is the default number of layers fetched at once.
const DefaultJobs = 4

// PullOptions tune Prewarm. A nil *PullOptions means all defaults.
type PullOptions struct {
	// Platform to pick from an index. Default: HostPlatform().
	Platform Platform
	// Offline resolves tags from their last resolution on this worker and
	// never contacts a registry: what is not cached fails with ErrNotCached.
	// It is Policy PullNever.
	Offline bool
	// Policy says when a tag is resolved at its registry, as Kubernetes'
	// imagePullPolicy says it. Default PullMissing. A digest never asks the
	// registry once its image is cached.
	Policy PullPolicy
	// Warnf receives warnings: a registry that could not be reached, whose
	// tag's last resolution was used. Default: discard.
	Warnf func(format string, args ...any)
	// Debugf receives what the pull decided without the registry (a tag's
	// last resolution used). Default: discard.
	Debugf func(format string, args ...any)
	// InsecureRegistries are registry hosts ("host:port") that may be
	// reached over plain HTTP. Loopback registries always may; others fail
	// with a *PlainHTTPError.
	InsecureRegistries []string
	// Jobs bounds the layers fetched at once. Default DefaultJobs.
	Jobs int
	// Progress receives per-layer progress. Default: none.
	Progress Progress
	// Unpack bounds what the layers may unpack to.
	Unpack UnpackOptions
	// MountPoints are mount points the entry must have besides the Store's
	// (WithMountPoints): a new entry gets them before it is published, a
	// cached one that lacks one gets it before Prewarm returns. Default:
	// none.
	MountPoints []MountPoint
}

// PullPolicy says when Prewarm resolves a tag at its registry.
type PullPolicy string

// Pull policies, named as Kubernetes names them.
const (
	// PullMissing uses a tag's last resolution on this worker if its image
	// is cached, and asks the registry otherwise.
	PullMissing PullPolicy = "missing"
	// PullAlways asks the registry every time; if the registry cannot be
	// reached, a cached last resolution is used, with a warning.
	PullAlways PullPolicy = "always"
	// PullNever never contacts a registry (Offline).
	PullNever PullPolicy = "never"
)

// ParsePullPolicy parses "missing", "always" or "never".
func ParsePullPolicy(s string) (PullPolicy, error) {
	switch p := PullPolicy(s); p {
	case PullMissing, PullAlways, PullNever:
		return p, nil
	}
	return "", fmt.Errorf("pull policy %q: want missing, always or never: %w", s, errdefs.ErrInvalidArgument)
}

func (o *PullOptions) withDefaults() *PullOptions {
	var out PullOptions
	if o != nil {
		out = *o
	}
	if out.Offline {
		out.Policy = PullNever
	}
	if out.Policy == "" {
		out.Policy = PullMissing
	}
	if out.Warnf == nil {
		out.Warnf = func(string, ...any) {}
	}
	if out.Debugf == nil {
		out.Debugf = func(string, ...any) {}
	}
	if out.Platform == (Platform{}) {
		out.Platform = HostPlatform()
	}
	out.Platform = out.Platform.normalize()
	out.Unpack = out.Unpack.withDefaults()
	if out.Jobs <= 0 {
		out.Jobs = DefaultJobs
	}
	if out.Progress == nil {
		out.Progress = nopProgress{}
	}
	return &out
}

// Progress receives pull progress. Implementations must be safe for
// concurrent use: layers are fetched in parallel.
type Progress interface {
	// Layer reports the state of one layer.
	Layer(LayerStatus)
}

// LayerStatus is the state of one layer of a pull.
type LayerStatus struct {
	// Index counts from 1, bottom layer first; Count is the number of layers.
	Index, Count int
	// Digest is the layer's compressed digest.
	Digest string
	// Size is the compressed size; Fetched the bytes fetched so far.
	Size, Fetched int64
	// Phase is "fetching", "fetched", "unpacking" or "done"; a layer may be
	// unpacking while it is still fetching.
	Phase string
}

type nopProgress struct{}

func (nopProgress) Layer(LayerStatus) {}

// Result is what Prewarm reports; its JSON form is `flmbox prewarm --json`.
type Result struct {
	// IndexDigest is the digest the image was named by or resolved to: the
	// index's, or the manifest's for a single-platform image.
	IndexDigest string `json:"index_digest"`
	// Platform is the platform chosen.
	Platform string `json:"platform"`
	// ManifestDigest is the platform manifest's digest.
	ManifestDigest string `json:"manifest_digest"`
	// Rootfs is the unpacked tree.
	Rootfs string `json:"rootfs"`
	// SizeBytes is the size of the tree's regular files.
	SizeBytes int64 `json:"size_bytes"`
	// Cached is true when nothing had to be fetched or unpacked.
	Cached bool `json:"cached"`
	// Skipped are the optional mount points the tree does not have: the
	// image has their paths as another type (MountPoint.Optional).
	Skipped []MountPoint `json:"-"`
	// Moved are the optional mount points the tree has at the target of
	// the image's symlink at their path (Moved).
	Moved []Moved `json:"-"`
}

// Prewarm makes IMAGE available as an unpacked rootfs in the cache and
// returns where it is. A digest reference whose platform was prewarmed before
// is answered from the disk alone; a tag is resolved at the registry (or, with
// Offline, from its last resolution). The tree has the Store's and the
// pull's mount points when Prewarm returns.
func (s *Store) Prewarm(ctx context.Context, image string, opts *PullOptions) (*Result, error) {
	o := opts.withDefaults()
	ref, err := ParseReference(image)
	if err != nil {
		return nil, err
	}
	points, err := s.requiredMountPoints(o)
	if err != nil {
		return nil, err
	}
	named := ref.Digest
	if named.Hex == "" && o.Policy == PullNever {
		if named, err = s.lastResolution(ref); err != nil {
			return nil, err
		}
	}
	if named.Hex != "" {
		if res, found, err := s.cached(ctx, named, o.Platform, points); found {
			return res, err
		}
		if o.Policy == PullNever {
			return nil, fmt.Errorf("image %s for %s is not cached, and an offline pull fetches nothing: %w", image, o.Platform, ErrNotCached)
		}
	}
	// A tag: its last resolution, if cached, unless the policy asks the
	// registry (a layout on the disk is always read: it costs no network).
	var last v1.Hash
	hasLast := false
	if named.Hex == "" {
		var err error
		last, err = s.lastResolution(ref)
		hasLast = err == nil
	}
	if hasLast && o.Policy == PullMissing && ref.Layout == "" {
		if res, found, err := s.cached(ctx, last, o.Platform, points); found {
			o.Debugf("%s: its last resolution here, %s, is cached: the registry was not asked (pull policy always asks it)", image, last)
			return res, err
		}
	}

	src, err := openSource(ctx, ref, o)
	if err != nil {
		return nil, err
	}
	raw, mt, err := src.top(ctx)
	if err != nil {
		if hasLast && unreachable(err) {
			if res, found, cerr := s.cached(ctx, last, o.Platform, points); found {
				o.Warnf("the registry of %s could not be reached (%v): using its last resolution here, %s", image, err, last)
				return res, cerr
			}
		}
		return nil, fmt.Errorf("resolve %s: %w", image, err)
	}
	topDigest := sha256Hash(raw)
	if named.Hex != "" && topDigest != named {
		return nil, &DigestMismatchError{What: "manifest of " + image, Kind: "digest", Expected: named.String(), Actual: topDigest.String()}
	}
	kind, err := classify(raw, mt)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", image, err)
	}
	if ref.Digest.Hex == "" {
		rec := refRecord{Ref: ref.tagKey(), Digest: topDigest.String(), Resolved: time.Now().UTC()}
		if err := writeJSONAtomic(s.refPath(ref.tagKey()), rec); err != nil {
			return nil, fmt.Errorf("record resolution of %s: %w", image, err)
		}
		if res, found, err := s.cached(ctx, topDigest, o.Platform, points); found {
			return res, err
		}
	}

	// Descend from the index to the platform's manifest. A wrapper index
	// (one entry, itself an index: what pushing an OCI layout's index.json
	// makes) is followed, one level deep.
	manifestDigest, manifestRaw := topDigest, raw
	for depth := 0; kind == kindIndex; depth++ {
		if depth == 2 {
			return nil, fmt.Errorf("resolve %s: indexes nested more than one level deep are not supported: %w", image, errdefs.ErrNotImplemented)
		}
		d, err := pickManifest(manifestRaw, o.Platform)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", image, err)
		}
		manifestDigest = d.Digest
		if manifestRaw, mt, err = src.manifest(ctx, d.Digest); err != nil {
			return nil, fmt.Errorf("resolve %s for %s: %w", image, o.Platform, err)
		}
		if got := sha256Hash(manifestRaw); got != d.Digest {
			return nil, &DigestMismatchError{What: "manifest for " + o.Platform.String(), Kind: "digest", Expected: d.Digest.String(), Actual: got.String()}
		}
		if kind, err = classify(manifestRaw, mt); err != nil {
			return nil, fmt.Errorf("resolve %s for %s: %w", image, o.Platform, err)
		}
	}
	m, err := v1.ParseManifest(strings.NewReader(string(manifestRaw)))
	if err != nil {
		return nil, fmt.Errorf("parse manifest %s: %w: %w", manifestDigest, err, errdefs.ErrInvalidArgument)
	}
	img, cached, err := s.build(ctx, src, ref.at(topDigest), topDigest, manifestDigest, m, o, points)
	if err != nil {
		return nil, err
	}
	return &Result{IndexDigest: topDigest.String(), Platform: o.Platform.String(), ManifestDigest: img.ManifestDigest,
		Rootfs: img.Rootfs, SizeBytes: img.SizeBytes, Cached: cached, Skipped: img.Skipped, Moved: img.Moved}, nil
}

// unreachable reports whether err, a failure to resolve a reference, is
// the registry's absence (no connection, no answer) rather than its answer.
func unreachable(err error) bool {
	var te *transport.Error
	return !errors.As(err, &te) && !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrPermissionDenied)
}

// cached answers a Prewarm from the alias of (named, p), with no network,
// once the entry has the mount points. found is false when the alias leads
// to no entry.
func (s *Store) cached(ctx context.Context, named v1.Hash, p Platform, points []MountPoint) (_ *Result, found bool, _ error) {
	img, err := s.resolveAlias(named, p)
	if err != nil {
		return nil, false, nil
	}
	m, err := parseDigest(img.ManifestDigest)
	if err != nil {
		return nil, false, nil
	}
	if img, err = s.ensureMountPoints(ctx, m.Hex, img, points); err != nil {
		if errors.Is(err, ErrNotCached) {
			return nil, false, nil // removed meanwhile
		}
		return nil, true, err
	}
	s.touch(m.Hex)
	return &Result{IndexDigest: named.String(), Platform: p.String(), ManifestDigest: img.ManifestDigest,
		Rootfs: img.Rootfs, SizeBytes: img.SizeBytes, Cached: true, Skipped: img.Skipped, Moved: img.Moved}, true, nil
}

// pickManifest returns the first image manifest of the index for p, as
// go-containerregistry does, after normalising both platforms.
func pickManifest(raw []byte, p Platform) (*v1.Descriptor, error) {
	idx, err := v1.ParseIndexManifest(strings.NewReader(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("parse index: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	var have []string
	for i := range idx.Manifests {
		d := &idx.Manifests[i]
		if d.Platform == nil {
			continue
		}
		if p.matches(*d.Platform) {
			return d, checkDescriptor(d)
		}
		if d.Platform.OS != "unknown" {
			have = append(have, Platform{OS: d.Platform.OS, Architecture: d.Platform.Architecture, Variant: d.Platform.Variant}.normalize().String())
		}
	}
	if len(idx.Manifests) == 1 && idx.Manifests[0].Platform == nil && idx.Manifests[0].MediaType.IsIndex() {
		return &idx.Manifests[0], checkDescriptor(&idx.Manifests[0])
	}
	if len(have) == 0 {
		return nil, fmt.Errorf("the index names no platforms; name a platform manifest by its digest: %w", errdefs.ErrNotFound)
	}
	return nil, fmt.Errorf("the index has no image for %s (it has %s): %w", p, strings.Join(have, ", "), ErrPlatformNotFound)
}

func checkDescriptor(d *v1.Descriptor) error {
	_, err := parseDigest(d.Digest.String())
	return err
}

// maxLayers bounds the layers of an image (each is stored in a directory
// of its own, and its use lock held while the image is pulled).
const maxLayers = 512

// build unpacks the image with manifest m into the cache unless it is there,
// gives it the mount points, and records the alias (named, platform) -> m,
// all under the entry's lock. It reports whether the entry was already
// cached.
func (s *Store) build(ctx context.Context, src source, refName string, named, md v1.Hash, m *v1.Manifest, o *PullOptions, points []MountPoint) (_ *Image, cached bool, err error) {
	unlock, err := s.lock(ctx, md.Hex)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if img, err := s.get(md.Hex); err == nil {
		if img.Platform != o.Platform.String() {
			return nil, false, fmt.Errorf("image %s is for %s, not %s: %w", md, img.Platform, o.Platform, ErrPlatformNotFound)
		}
		if img, err = s.addMountPoints(md.Hex, img, points); err != nil {
			return nil, false, err
		}
		s.touch(md.Hex)
		return img, true, s.writeAlias(named, refName, o.Platform, img)
	}
	if exists(s.entryDir(md.Hex)) {
		// Published but unreadable (damaged by a power loss): rebuild it.
		if _, err := s.discard(md.Hex); err != nil {
			return nil, false, err
		}
	}
	s.removeStaging(md.Hex) // what a killed pull of this entry left
	if len(m.Layers) > maxLayers {
		return nil, false, fmt.Errorf("image %s has %d layers, more than %d: %w", md, len(m.Layers), maxLayers, errdefs.ErrInvalidArgument)
	}
	declared := m.Config.Size
	for _, l := range m.Layers {
		declared += max(l.Size, 0)
	}
	if declared > o.Unpack.MaxBytes {
		return nil, false, &LimitError{What: "compressed bytes", Limit: o.Unpack.MaxBytes}
	}

	cfgRaw, cfg, err := fetchConfig(ctx, src, m)
	if err != nil {
		return nil, false, err
	}
	if got := (Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}).normalize(); got != o.Platform {
		return nil, false, fmt.Errorf("image %s is for %s, not %s: %w", md, got, o.Platform, ErrPlatformNotFound)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return nil, false, fmt.Errorf("image %s has %d layers but its config lists %d diff_ids: %w", md, len(m.Layers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	for i, l := range m.Layers {
		if err := checkLayer(l); err != nil {
			return nil, false, fmt.Errorf("layer %d (%s): %w", i+1, l.Digest, err)
		}
		if _, err := parseDigest(cfg.RootFS.DiffIDs[i].String()); err != nil {
			return nil, false, fmt.Errorf("layer %d (%s): diff_id: %w", i+1, l.Digest, err)
		}
	}

	staging, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), md.Hex+"-")
	if err != nil {
		return nil, false, fmt.Errorf("create staging directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(staging)
		}
	}()
	if err := os.Mkdir(filepath.Join(staging, "rootfs"), 0o755); err != nil {
		return nil, false, err
	}
	size, release, err := s.fetchAndUnpack(ctx, src, m.Layers, cfg.RootFS.DiffIDs, staging, o)
	if err != nil {
		s.removeUnusedLayers(hexes(cfg.RootFS.DiffIDs))
		return nil, false, err
	}
	defer func() {
		release()
		if err != nil {
			s.removeUnusedLayers(hexes(cfg.RootFS.DiffIDs))
		}
	}()
	// After the last layer, before the entry is published: the tree is
	// never changed in place while sandboxes may use it.
	mp, err := prepareMountPoints(filepath.Join(staging, "rootfs"), points)
	if err != nil {
		return nil, false, fmt.Errorf("prepare the mount points of image %s: %w", md, err)
	}
	img := &Image{ManifestDigest: md.String(), Platform: o.Platform.String(), ConfigDigest: m.Config.Digest.String(),
		SizeBytes: size, Created: time.Now().UTC(), MountPoints: mp.done, Skipped: mp.skipped, Added: mp.added}
	for i, l := range m.Layers {
		img.Layers = append(img.Layers, l.Digest.String())
		img.DiffIDs = append(img.DiffIDs, cfg.RootFS.DiffIDs[i].String())
	}
	if err := os.WriteFile(filepath.Join(staging, "config.json"), cfgRaw, 0o600); err != nil {
		return nil, false, err
	}
	if err := writeJSONAtomic(filepath.Join(staging, "image.json"), img); err != nil {
		return nil, false, err
	}
	if err := os.WriteFile(filepath.Join(staging, "last-used"), nil, 0o600); err != nil {
		return nil, false, err
	}
	if err := os.Rename(staging, s.entryDir(md.Hex)); err != nil {
		return nil, false, fmt.Errorf("publish image %s: %w", md, err)
	}
	img.Rootfs = filepath.Join(s.entryDir(md.Hex), "rootfs")
	return img, false, s.writeAlias(named, refName, o.Platform, img)
}

// hexes returns the hex parts of digests.
func hexes(digests []v1.Hash) []string {
	out := make([]string, len(digests))
	for i, d := range digests {
		out[i] = d.Hex
	}
	return out
}

func fetchConfig(ctx context.Context, src source, m *v1.Manifest) ([]byte, *v1.ConfigFile, error) {
	if _, err := parseDigest(m.Config.Digest.String()); err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	if m.Config.Size > maxManifestBytes {
		return nil, nil, fmt.Errorf("config of %d bytes is larger than %d: %w", m.Config.Size, maxManifestBytes, errdefs.ErrInvalidArgument)
	}
	rc, err := src.blob(ctx, m.Config.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch config %s: %w", m.Config.Digest, err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
	if got := sha256Hash(raw); got != m.Config.Digest && (err == nil || int64(len(raw)) == m.Config.Size) {
		return nil, nil, &DigestMismatchError{What: "config", Kind: "digest", Expected: m.Config.Digest.String(), Actual: got.String()}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fetch config %s: %w", m.Config.Digest, err)
	}
	cfg, err := v1.ParseConfigFile(strings.NewReader(string(raw)))
	if err != nil {
		return nil, nil, fmt.Errorf("parse config %s: %w: %w", m.Config.Digest, err, errdefs.ErrInvalidArgument)
	}
	return raw, cfg, nil
}

// checkLayer refuses layers flmbox does not fetch: foreign and
// non-distributable layers (their URLs would leak credentials or reach
// arbitrary hosts, CVE-2020-15157) and unknown media types.
func checkLayer(l v1.Descriptor) error {
	if _, err := parseDigest(l.Digest.String()); err != nil {
		return err
	}
	if l.Size < 0 {
		return fmt.Errorf("negative size: %w", errdefs.ErrInvalidArgument)
	}
	switch l.MediaType {
	case types.OCILayer, types.OCIUncompressedLayer, types.OCILayerZStd, types.DockerLayer, types.DockerUncompressedLayer:
		return nil
	case types.DockerForeignLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
		return fmt.Errorf("foreign or non-distributable layers (%s) are not supported: %w", l.MediaType, errdefs.ErrNotImplemented)
	}
	return fmt.Errorf("unknown layer media type %q: %w", l.MediaType, errdefs.ErrNotImplemented)
}

// fetchAndUnpack makes the image's tree in staging/rootfs from its layers.
// Each layer not stored yet is fetched and stored (storeLayer), up to
// o.Jobs at once, as it streams: its blob's size and digest and its
// diff_id are checked at its end, and its staging directory is published
// only if all matched. Meanwhile the stored layers are applied to the tree
// in order (ApplyStored), each once it and every layer below it are
// stored. It returns the tree's size, and release, which lets go of the
// layers' use locks: the caller calls it once an image naming them is
// published, or the build failed.
func (s *Store) fetchAndUnpack(ctx context.Context, src source, layers []v1.Descriptor, diffIDs []v1.Hash, staging string, o *PullOptions) (size int64, release func(), err error) {
	var mu sync.Mutex
	var releases []func()
	releaseAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range releases {
			r()
		}
		releases = nil
	}
	defer func() {
		if err != nil {
			releaseAll()
		}
	}()
	status := func(i int, phase string, fetched int64) {
		o.Progress.Layer(LayerStatus{Index: i + 1, Count: len(layers), Digest: layers[i].Digest.String(), Size: layers[i].Size, Fetched: fetched, Phase: phase})
	}
	stored := make([]chan struct{}, len(layers))
	for i := range stored {
		stored[i] = make(chan struct{})
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		u, err := NewUnpacker(filepath.Join(staging, "rootfs"), &o.Unpack)
		if err != nil {
			return err
		}
		defer u.Close()
		for i, l := range layers {
			select {
			case <-stored[i]:
			case <-gctx.Done():
				return gctx.Err()
			}
			status(i, "unpacking", l.Size)
			if err := u.ApplyStored(gctx, s.layerDir(diffIDs[i].Hex)); err != nil {
				return fmt.Errorf("layer %d (%s): %w", i+1, l.Digest, err)
			}
			status(i, "done", l.Size)
		}
		size = u.Size()
		return nil
	})
	sem := make(chan struct{}, o.Jobs)
	for i, l := range layers {
		select {
		case sem <- struct{}{}:
		case <-gctx.Done():
			return 0, nil, g.Wait()
		}
		g.Go(func() error {
			defer func() { <-sem }()
			hex := diffIDs[i].Hex
			rel, err := s.useLayer(gctx, hex)
			if err != nil {
				return err
			}
			mu.Lock()
			releases = append(releases, rel)
			mu.Unlock()
			cached, err := s.storeLayerOnce(gctx, hex, func(dir string) (int64, error) {
				return fetchLayer(gctx, src, l, diffIDs[i], dir, fmt.Sprintf("layer %d (%s)", i+1, l.Digest), &o.Unpack,
					func(n int64) { status(i, "fetching", n) })
			})
			if err != nil {
				return err
			}
			if cached {
				status(i, "cached", 0)
			} else {
				status(i, "fetched", l.Size)
			}
			close(stored[i])
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, nil, err
	}
	return size, releaseAll, nil
}

// refused reports whether an unpack error is a refusal of the layer's
// content (unsafe entries, limits) rather than a failure to read it.
func refused(err error) bool {
	return errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrResourceExhausted)
}

// fetchLayer fetches layer l and stores it in dir (storeLayer) as it
// streams, decompressing and hashing ahead of the store in a goroutine of
// its own. It checks the blob's size and digest and the layer's diff_id
// once the stream has been read to its end; what describes the layer in
// errors. Refused content fails at once: the rest of the layer is not
// worth fetching. Other failures (corrupt compression, a cut stream) read
// the blob to its end first, so that a digest mismatch, which explains
// them better, is what is reported.
func fetchLayer(ctx context.Context, src source, l v1.Descriptor, diffID v1.Hash, dir, what string, opts *UnpackOptions, progress func(int64)) (int64, error) {
	rc, err := src.blob(ctx, l.Digest)
	if err != nil {
		return 0, fmt.Errorf("fetch %s: %w", what, err)
	}
	stop := sync.OnceFunc(func() { rc.Close() })
	defer stop()
	bh := sha256.New()
	blob := &progressReader{r: io.LimitReader(&ctxReader{ctx: ctx, r: rc}, l.Size+1), report: progress}
	hashed := io.TeeReader(blob, bh)
	size, err := storeStream(ctx, hashed, diffID, dir, what, opts, stop)
	if err != nil && ctx.Err() != nil {
		return 0, err
	}
	if refused(err) {
		// The refused bytes are unverified: a corrupt download is better
		// told by its digest, if the rest of it comes within refusalWait
		// (storeStream stops the fetch then).
		io.Copy(io.Discard, hashed)
		if blob.n == l.Size {
			if got := hashOf(bh); got != l.Digest.String() {
				return 0, fmt.Errorf("fetch %s: %w", what, &DigestMismatchError{What: "blob", Kind: "digest", Expected: l.Digest.String(), Actual: got})
			}
		}
		return 0, err
	}
	// What decompression left of the blob counts in its digest. A source
	// that checks digests itself fails the read at the end: the mismatch,
	// seen here, says more.
	_, derr := io.Copy(io.Discard, hashed)
	if blob.n == l.Size {
		if got := hashOf(bh); got != l.Digest.String() {
			return 0, fmt.Errorf("fetch %s: %w", what, &DigestMismatchError{What: "blob", Kind: "digest", Expected: l.Digest.String(), Actual: got})
		}
	}
	if derr != nil {
		return 0, fmt.Errorf("fetch %s: %w", what, derr)
	}
	if blob.n != l.Size {
		return 0, fmt.Errorf("fetch %s: size mismatch: the manifest says %d bytes, the blob has %s: %w", what, l.Size, sizeSeen(blob.n, l.Size), errdefs.ErrFailedPrecondition)
	}
	return size, err
}

// refusalWait is how long a pull whose layer was refused waits for the
// rest of the layer's blob, to check its digest.
const refusalWait = time.Second

// storeStream decompresses a layer blob's stream and stores it in dir,
// checking its diff_id. Decompression and hashing run ahead of the store in
// their own goroutine, which has ended when storeStream returns: abort
// makes its read of r return. It is called when ctx is done, and
// refusalWait after the store refused the layer's content.
func storeStream(ctx context.Context, r io.Reader, diffID v1.Hash, dir, what string, opts *UnpackOptions, abort func()) (int64, error) {
	dr, err := decompress(r)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	defer dr.Close()
	h := sha256.New()
	ra, err := readahead.NewReaderSize(io.TeeReader(dr, h), 4, 1<<20)
	if err != nil {
		return 0, err
	}
	size, err := storeLayer(ctx, ra, dir, opts)
	switch {
	case err != nil && ctx.Err() != nil:
		abort()
	case refused(err):
		time.AfterFunc(refusalWait, abort)
	}
	ra.Close()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if got := hashOf(h); got != diffID.String() {
		return 0, &DigestMismatchError{What: what, Kind: "diff_id", Expected: diffID.String(), Actual: got}
	}
	return size, nil
}

func sizeSeen(n, want int64) string {
	if n > want {
		return "more"
	}
	return fmt.Sprint(n)
}

func hashOf(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// progressReader reports the bytes read so far.
type progressReader struct {
	r      io.Reader
	n      int64
	report func(int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if n > 0 {
		p.report(p.n)
	}
	return n, err
}

// ctxReader stops a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
