package bench

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/flmbox/flmbox/rootfs"
)

// registryRepo is the repository the image is served under.
const registryRepo = "flmbox-bench/image"

// loopbackRegistry is go-containerregistry's registry, in this process, on
// 127.0.0.1 (blobs in memory), as a worker's nearby registry would be.
type loopbackRegistry struct {
	srv  *http.Server
	repo name.Repository
}

// startRegistry serves an empty registry on a free port of 127.0.0.1.
func startRegistry() (*loopbackRegistry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start the loopback registry: %w", err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: time.Minute}
	go srv.Serve(ln)
	repo, err := name.NewRepository(ln.Addr().String() + "/" + registryRepo)
	if err != nil {
		srv.Close()
		return nil, err
	}
	return &loopbackRegistry{srv: srv, repo: repo}, nil
}

func (r *loopbackRegistry) close() { r.srv.Close() }

// ref names digest d in the registry.
func (r *loopbackRegistry) ref(d string) string { return r.repo.Name() + "@" + d }

// push copies the image that image names, by its index digest, into the
// registry: every manifest and index it leads to, and the config and layers
// of the platform manifest only (the registry checks that an index's
// manifests exist, not their blobs). What the copy reads is verified by
// the prewarms that follow, which check every digest.
func (r *loopbackRegistry) push(ctx context.Context, image string, indexDigest, manifestDigest string) error {
	top, err := sourceObject(ctx, image, indexDigest)
	if err != nil {
		return err
	}
	md, err := v1.NewHash(manifestDigest)
	if err != nil {
		return err
	}
	opts := []remote.Option{remote.WithContext(ctx)}
	if err := r.pushTree(top, md, 0, opts); err != nil {
		return fmt.Errorf("copy %s into the loopback registry: %w", image, err)
	}
	return nil
}

// pushable is an index or an image manifest.
type pushable interface {
	remote.Taggable
	Digest() (v1.Hash, error)
}

func (r *loopbackRegistry) pushTree(obj pushable, manifest v1.Hash, depth int, opts []remote.Option) error {
	d, err := obj.Digest()
	if err != nil {
		return err
	}
	switch o := obj.(type) {
	case v1.ImageIndex:
		if depth > 2 {
			return fmt.Errorf("index %s: nested too deep", d)
		}
		im, err := o.IndexManifest()
		if err != nil {
			return err
		}
		for _, desc := range im.Manifests {
			var child pushable
			switch {
			case desc.MediaType.IsIndex():
				child, err = o.ImageIndex(desc.Digest)
			case desc.MediaType.IsImage():
				child, err = o.Image(desc.Digest)
			default:
				continue // not checked by the registry; flmbox never reads it
			}
			if err == nil {
				err = r.pushTree(child, manifest, depth+1, opts)
			}
			if err != nil {
				return err
			}
		}
	case v1.Image:
		if d == manifest {
			return remote.Write(r.repo.Digest(d.String()), o, opts...)
		}
	}
	return remote.Put(r.repo.Digest(d.String()), obj, opts...)
}

// sourceObject opens the index or manifest with digest d where image comes
// from: a registry or an OCI layout.
func sourceObject(ctx context.Context, image, d string) (pushable, error) {
	ref, err := rootfs.ParseReference(image)
	if err != nil {
		return nil, err
	}
	h, err := v1.NewHash(d)
	if err != nil {
		return nil, err
	}
	if ref.Layout == "" {
		desc, err := remote.Get(ref.Registry.Context().Digest(d), remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", image, err)
		}
		if desc.MediaType.IsIndex() {
			return desc.ImageIndex()
		}
		return desc.Image()
	}
	p, err := layout.FromPath(ref.Layout)
	if err != nil {
		return nil, fmt.Errorf("open OCI layout %s: %w", ref.Layout, err)
	}
	root, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("open OCI layout %s: %w", ref.Layout, err)
	}
	if rd, err := root.Digest(); err == nil && rd == h {
		return root, nil // index.json itself
	}
	return findInIndex(root, h, 0)
}

// findInIndex finds the index or manifest h below idx.
func findInIndex(idx v1.ImageIndex, h v1.Hash, depth int) (pushable, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, desc := range im.Manifests {
		switch {
		case desc.Digest == h && desc.MediaType.IsIndex():
			return idx.ImageIndex(h)
		case desc.Digest == h && desc.MediaType.IsImage():
			return idx.Image(h)
		case desc.MediaType.IsIndex() && depth < 2:
			child, err := idx.ImageIndex(desc.Digest)
			if err != nil {
				return nil, err
			}
			if found, err := findInIndex(child, h, depth+1); err == nil {
				return found, nil
			}
		}
	}
	return nil, fmt.Errorf("no index or manifest %s in the OCI layout: %w", h, errdefs.ErrNotFound)
}
