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
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
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
	Offline bool
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

func (o *PullOptions) withDefaults() *PullOptions {
	var out PullOptions
	if o != nil {
		out = *o
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
	if named.Hex == "" && o.Offline {
		if named, err = s.lastResolution(ref); err != nil {
			return nil, err
		}
	}
	if named.Hex != "" {
		if res, found, err := s.cached(ctx, named, o.Platform, points); found {
			return res, err
		}
		if o.Offline {
			return nil, fmt.Errorf("image %s for %s is not cached, and an offline pull fetches nothing: %w", image, o.Platform, ErrNotCached)
		}
	}

	src, err := openSource(ctx, ref, o)
	if err != nil {
		return nil, err
	}
	raw, mt, err := src.top(ctx)
	if err != nil {
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
	img, cached, err := s.build(ctx, src, topDigest, manifestDigest, m, o, points)
	if err != nil {
		return nil, err
	}
	return &Result{IndexDigest: topDigest.String(), Platform: o.Platform.String(), ManifestDigest: img.ManifestDigest,
		Rootfs: img.Rootfs, SizeBytes: img.SizeBytes, Cached: cached, Skipped: img.Skipped}, nil
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
		Rootfs: img.Rootfs, SizeBytes: img.SizeBytes, Cached: true, Skipped: img.Skipped}, true, nil
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

// maxLayers bounds the layers of an image (each is fetched into a file of
// its own while the image is pulled).
const maxLayers = 512

// build unpacks the image with manifest m into the cache unless it is there,
// gives it the mount points, and records the alias (named, platform) -> m,
// all under the entry's lock. It reports whether the entry was already
// cached.
func (s *Store) build(ctx context.Context, src source, named, md v1.Hash, m *v1.Manifest, o *PullOptions, points []MountPoint) (_ *Image, cached bool, err error) {
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
		return img, true, s.writeAlias(named, o.Platform, img)
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
	size, err := fetchAndUnpack(ctx, src, m.Layers, cfg.RootFS.DiffIDs, staging, o)
	if err != nil {
		return nil, false, err
	}
	// After the last layer, before the entry is published: the tree is
	// never changed in place while sandboxes may use it.
	mp, err := prepareMountPoints(filepath.Join(staging, "rootfs"), points)
	if err != nil {
		return nil, false, fmt.Errorf("prepare the mount points of image %s: %w", md, err)
	}
	img := &Image{ManifestDigest: md.String(), Platform: o.Platform.String(), ConfigDigest: m.Config.Digest.String(),
		SizeBytes: size, Created: time.Now().UTC(), MountPoints: mp.done, Skipped: mp.skipped, Added: mp.added}
	for _, l := range m.Layers {
		img.Layers = append(img.Layers, l.Digest.String())
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
	return img, false, s.writeAlias(named, o.Platform, img)
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

// fetchAndUnpack fetches the layers in parallel (up to o.Jobs at once, bottom
// layer first) into spool files in staging/blobs, verifying each blob's size
// and digest as it streams, and meanwhile unpacks them in order into
// staging/rootfs, each as soon as its first bytes arrive. A goroutine
// decompresses and hashes ahead of the unpacker; each diff_id is checked once
// the layer's stream has been read to its end, and a layer counts as applied
// only once its fetch verified the blob. It returns the unpacked size.
func fetchAndUnpack(ctx context.Context, src source, layers []v1.Descriptor, diffIDs []v1.Hash, staging string, o *PullOptions) (int64, error) {
	blobs := filepath.Join(staging, "blobs")
	if err := os.Mkdir(blobs, 0o700); err != nil {
		return 0, err
	}
	spools := make([]*spool, len(layers))
	for i := range layers {
		sp, err := newSpool(filepath.Join(blobs, fmt.Sprint(i)))
		if err != nil {
			return 0, err
		}
		defer sp.close()
		spools[i] = sp
	}
	status := func(i int, phase string, fetched int64) {
		o.Progress.Layer(LayerStatus{Index: i + 1, Count: len(layers), Digest: layers[i].Digest.String(), Size: layers[i].Size, Fetched: fetched, Phase: phase})
	}

	g, gctx := errgroup.WithContext(ctx)
	var size int64
	g.Go(func() error {
		u, err := NewUnpacker(filepath.Join(staging, "rootfs"), &o.Unpack)
		if err != nil {
			return err
		}
		defer u.Close()
		for i, l := range layers {
			what := fmt.Sprintf("layer %d (%s)", i+1, l.Digest)
			status(i, "unpacking", 0)
			err := applyLayer(gctx, u, spools[i], diffIDs[i], what)
			// Refused content fails at once: the rest of the layer is not
			// worth fetching. Other failures (corrupt compression, a cut
			// stream) wait for the fetch, whose digest mismatch explains them
			// better.
			if refused(err) {
				if done, ferr := spools[i].result(); done && ferr != nil {
					return ferr
				}
				return err
			}
			if ferr := spools[i].wait(); ferr != nil {
				return ferr
			}
			if err != nil {
				return err
			}
			spools[i].close()
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
			for _, sp := range spools[i:] {
				sp.finish(gctx.Err())
			}
			return 0, g.Wait()
		}
		g.Go(func() error {
			defer func() { <-sem }()
			err := fetchBlob(gctx, src, l, spools[i], func(n int64) { status(i, "fetching", n) })
			if err != nil {
				err = fmt.Errorf("fetch layer %d (%s): %w", i+1, l.Digest, err)
			} else {
				status(i, "fetched", l.Size)
			}
			spools[i].finish(err)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return size, nil
}

// refused reports whether an unpack error is a refusal of the layer's
// content (unsafe entries, limits) rather than a failure to read it.
func refused(err error) bool {
	return errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrResourceExhausted)
}

// fetchBlob copies blob d into w, checking its size and digest.
func fetchBlob(ctx context.Context, src source, d v1.Descriptor, w io.Writer, progress func(int64)) error {
	rc, err := src.blob(ctx, d.Digest)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	pw := &progressWriter{w: io.MultiWriter(w, h), report: progress}
	n, err := io.Copy(pw, io.LimitReader(&ctxReader{ctx: ctx, r: rc}, d.Size+1))
	if n == d.Size {
		if got := hashOf(h); got != d.Digest.String() {
			return &DigestMismatchError{What: "blob", Kind: "digest", Expected: d.Digest.String(), Actual: got}
		}
	}
	if err != nil {
		return err
	}
	if n != d.Size {
		return fmt.Errorf("size mismatch: the manifest says %d bytes, the blob has %s: %w", d.Size, sizeSeen(n, d.Size), errdefs.ErrFailedPrecondition)
	}
	return nil
}

func sizeSeen(n, want int64) string {
	if n > want {
		return "more"
	}
	return fmt.Sprint(n)
}

// applyLayer decompresses and unpacks one layer as its spool fills, checking
// its diff_id. Decompression and hashing run ahead in their own goroutine,
// which is stopped (through its own context) before applyLayer returns, even
// when the fetch is still waiting for bytes.
func applyLayer(ctx context.Context, u *Unpacker, sp *spool, diffID v1.Hash, what string) error {
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	dr, err := decompress(sp.reader(lctx))
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer dr.Close()
	h := sha256.New()
	ra, err := readahead.NewReaderSize(io.TeeReader(dr, h), 4, 1<<20)
	if err != nil {
		return err
	}
	defer ra.Close()
	defer stop() // before ra.Close, which waits for the read ahead to end
	if err := u.Apply(ctx, ra); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if got := hashOf(h); got != diffID.String() {
		return &DigestMismatchError{What: what, Kind: "diff_id", Expected: diffID.String(), Actual: got}
	}
	return nil
}

func hashOf(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// progressWriter reports the bytes written so far.
type progressWriter struct {
	w      io.Writer
	n      int64
	report func(int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	p.report(p.n)
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
