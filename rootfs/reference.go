package rootfs

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// LayoutPrefix starts an IMAGE argument that names an OCI image layout on
// disk: "oci-layout:PATH[@sha256:…]".
const LayoutPrefix = "oci-layout:"

// Reference is a parsed IMAGE argument: a registry reference or an OCI layout.
type Reference struct {
	// Layout is the absolute path of an OCI image layout; empty for a
	// registry reference.
	Layout string
	// Registry is the registry reference; nil for a layout.
	Registry name.Reference
	// Digest is the digest the reference names (an index or a manifest);
	// zero when it names a tag, or a layout without a digest.
	Digest v1.Hash
}

// ParseReference parses an IMAGE argument: "name[:tag]", "name[:tag]@sha256:…"
// (the tag is then ignored) or "oci-layout:PATH[@sha256:…]". Registry names
// without a registry host are Docker Hub's, as with docker pull.
func ParseReference(s string) (Reference, error) {
	if rest, ok := strings.CutPrefix(s, LayoutPrefix); ok {
		p, dig := rest, ""
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			p, dig = rest[:i], rest[i+1:]
		}
		if p == "" {
			return Reference{}, fmt.Errorf("parse image %q: the layout path is empty: %w", s, errdefs.ErrInvalidArgument)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return Reference{}, fmt.Errorf("parse image %q: %w", s, err)
		}
		r := Reference{Layout: abs}
		if dig != "" {
			h, err := parseDigest(dig)
			if err != nil {
				return Reference{}, fmt.Errorf("parse image %q: %w", s, err)
			}
			r.Digest = h
		}
		return r, nil
	}
	ref, err := name.ParseReference(s)
	if err != nil {
		return Reference{}, fmt.Errorf("parse image %q: %w; want name[:tag], name@sha256:<64 hex> or %sPATH[@sha256:…]: %w", s, err, LayoutPrefix, errdefs.ErrInvalidArgument)
	}
	r := Reference{Registry: ref}
	if d, ok := ref.(name.Digest); ok {
		h, err := parseDigest(d.DigestStr())
		if err != nil {
			return Reference{}, fmt.Errorf("parse image %q: %w", s, err)
		}
		r.Digest = h
	}
	return r, nil
}

// parseDigest validates a digest before it is ever used in a path: sha256
// and 64 lowercase hex characters only.
func parseDigest(s string) (v1.Hash, error) {
	h, err := v1.NewHash(s)
	if err != nil || h.Algorithm != "sha256" || len(h.Hex) != 64 || strings.ToLower(h.Hex) != h.Hex {
		return v1.Hash{}, fmt.Errorf("digest %q is not sha256:<64 lowercase hex>: %w", s, errdefs.ErrInvalidArgument)
	}
	return h, nil
}

// String returns the reference in the form ParseReference reads.
func (r Reference) String() string {
	if r.Layout != "" {
		if r.Digest.Hex != "" {
			return LayoutPrefix + r.Layout + "@" + r.Digest.String()
		}
		return LayoutPrefix + r.Layout
	}
	return r.Registry.Name()
}

// at is the reference's repository (or layout) with digest d: what
// `images ls` shows for an image prewarmed through it.
func (r Reference) at(d v1.Hash) string {
	if r.Layout != "" {
		return LayoutPrefix + r.Layout + "@" + d.String()
	}
	return r.Registry.Context().Name() + "@" + d.String()
}

// tagKey names what a tag-like reference resolves through: the fully
// qualified "registry/repo:tag", or the layout path.
func (r Reference) tagKey() string {
	if r.Layout != "" {
		return LayoutPrefix + r.Layout
	}
	return r.Registry.Name()
}
