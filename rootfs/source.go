package rootfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// maxManifestBytes bounds manifests, indexes and configs read into memory.
const maxManifestBytes = 8 << 20

// source is where an image's documents and blobs come from: a registry or an
// OCI layout. It returns bytes as served; the caller verifies every digest.
type source interface {
	// top fetches the document the reference names and the media type its
	// server declares ("" when it declares none).
	top(ctx context.Context) ([]byte, types.MediaType, error)
	// manifest fetches a manifest or an index by digest.
	manifest(ctx context.Context, h v1.Hash) ([]byte, types.MediaType, error)
	// blob opens a blob by digest.
	blob(ctx context.Context, h v1.Hash) (io.ReadCloser, error)
}

func openSource(ctx context.Context, ref Reference, o *PullOptions) (source, error) {
	if ref.Layout != "" {
		p, err := layout.FromPath(ref.Layout)
		if err != nil {
			return nil, fmt.Errorf("open OCI layout %s: %w", ref.Layout, notFound(err))
		}
		return &layoutSource{path: p, digest: ref.Digest}, nil
	}
	host := ref.Registry.Context().RegistryStr()
	if slices.Contains(o.InsecureRegistries, host) {
		// Re-parse with name.Insecure so that ggcr may fall back to HTTP.
		r, err := name.ParseReference(ref.Registry.String(), name.Insecure)
		if err != nil {
			return nil, err
		}
		ref.Registry = r
	}
	t := &httpGuard{next: remote.DefaultTransport, insecure: o.InsecureRegistries}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithTransport(t),
		remote.WithJobs(o.Jobs),
		remote.WithUserAgent("flmbox"),
	}
	puller, err := remote.NewPuller(opts...)
	if err != nil {
		return nil, err
	}
	return &registrySource{ref: ref.Registry, opts: append(opts, remote.Reuse(puller))}, nil
}

type registrySource struct {
	ref  name.Reference
	opts []remote.Option
}

func (s *registrySource) top(ctx context.Context) ([]byte, types.MediaType, error) {
	return s.get(ctx, s.ref)
}

func (s *registrySource) manifest(ctx context.Context, h v1.Hash) ([]byte, types.MediaType, error) {
	return s.get(ctx, s.ref.Context().Digest(h.String()))
}

func (s *registrySource) get(ctx context.Context, ref name.Reference) ([]byte, types.MediaType, error) {
	d, err := remote.Get(ref, append(slices.Clip(s.opts), remote.WithContext(ctx))...)
	if err != nil {
		return nil, "", fmt.Errorf("fetch %s: %w", ref, err)
	}
	if len(d.Manifest) > maxManifestBytes {
		return nil, "", fmt.Errorf("fetch %s: manifest of %d bytes is larger than %d: %w", ref, len(d.Manifest), maxManifestBytes, errdefs.ErrInvalidArgument)
	}
	return d.Manifest, d.MediaType, nil
}

func (s *registrySource) blob(ctx context.Context, h v1.Hash) (io.ReadCloser, error) {
	l, err := remote.Layer(s.ref.Context().Digest(h.String()), append(slices.Clip(s.opts), remote.WithContext(ctx))...)
	if err != nil {
		return nil, err
	}
	return l.Compressed()
}

type layoutSource struct {
	path   layout.Path
	digest v1.Hash
}

// top returns the document the layout reference names: the blob of its
// digest, else the layout's index.json; an index.json that holds exactly one
// index or manifest stands for that one, as a registry tag would.
func (s *layoutSource) top(ctx context.Context) ([]byte, types.MediaType, error) {
	if s.digest.Hex != "" {
		return s.manifest(ctx, s.digest)
	}
	raw, err := readFileLimit(filepath.Join(string(s.path), "index.json"), maxManifestBytes)
	if err != nil {
		return nil, "", fmt.Errorf("read OCI layout index: %w", notFound(err))
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, "", fmt.Errorf("parse OCI layout index.json: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(idx.Manifests) == 1 && (idx.Manifests[0].MediaType.IsIndex() || idx.Manifests[0].MediaType.IsImage()) {
		return s.manifest(ctx, idx.Manifests[0].Digest)
	}
	return raw, types.OCIImageIndex, nil
}

func (s *layoutSource) manifest(_ context.Context, h v1.Hash) ([]byte, types.MediaType, error) {
	if _, err := parseDigest(h.String()); err != nil {
		return nil, "", err
	}
	raw, err := readFileLimit(filepath.Join(string(s.path), "blobs", h.Algorithm, h.Hex), maxManifestBytes)
	if err != nil {
		return nil, "", fmt.Errorf("read %s from OCI layout: %w", h, notFound(err))
	}
	return raw, "", nil
}

func (s *layoutSource) blob(_ context.Context, h v1.Hash) (io.ReadCloser, error) {
	if _, err := parseDigest(h.String()); err != nil {
		return nil, err
	}
	return s.path.Blob(h)
}

// notFound adds errdefs.ErrNotFound to the error of a file that does not
// exist: a layout, or a document of it, that is not there.
func notFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) && !errdefs.IsNotFound(err) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	return err
}

func readFileLimit(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
		}
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes: %w", p, limit, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// manifestKind is what a fetched document is, judged from its body.
type manifestKind int

const (
	kindImage manifestKind = iota
	kindIndex
)

// classify decides whether raw is an image index or an image manifest from
// its body, refusing documents that could be read as both (CVE-2021-41190)
// and bodies whose mediaType contradicts the server's.
func classify(raw []byte, served types.MediaType) (manifestKind, error) {
	var probe struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     types.MediaType `json:"mediaType"`
		Manifests     json.RawMessage `json:"manifests"`
		Layers        json.RawMessage `json:"layers"`
		Config        json.RawMessage `json:"config"`
		FSLayers      json.RawMessage `json:"fsLayers"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return 0, fmt.Errorf("parse manifest: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if probe.FSLayers != nil || probe.SchemaVersion == 1 {
		return 0, fmt.Errorf("docker schema 1 manifests are not supported; push the image again with a current client: %w", errdefs.ErrNotImplemented)
	}
	isIndex := probe.Manifests != nil
	isImage := probe.Layers != nil || probe.Config != nil
	if isIndex == isImage {
		return 0, fmt.Errorf("manifest is neither clearly an index nor an image (it has manifests=%t, layers/config=%t): %w", isIndex, isImage, errdefs.ErrInvalidArgument)
	}
	if probe.MediaType != "" && served != "" && probe.MediaType != served {
		return 0, fmt.Errorf("manifest says media type %s but was served as %s: %w", probe.MediaType, served, errdefs.ErrInvalidArgument)
	}
	mt := probe.MediaType
	if mt == "" {
		mt = served
	}
	if mt != "" && isIndex != mt.IsIndex() {
		return 0, fmt.Errorf("manifest media type %s does not match its content: %w", mt, errdefs.ErrInvalidArgument)
	}
	if isIndex {
		return kindIndex, nil
	}
	return kindImage, nil
}

// httpGuard refuses plain-HTTP requests except to loopback hosts and to the
// registries the user named as insecure. go-containerregistry would otherwise
// speak HTTP to any private-range address.
type httpGuard struct {
	next     http.RoundTripper
	insecure []string
}

func (g *httpGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !isLoopback(req.URL.Hostname()) && !slices.Contains(g.insecure, req.URL.Host) {
		return nil, &PlainHTTPError{Host: req.URL.Host}
	}
	return g.next.RoundTrip(req)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
