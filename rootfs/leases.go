package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Lease is a holder's lease on a cached image (Store.Lease).
type Lease struct {
	ManifestDigest string
	Holder         string
}

// Leases lists every lease on the cache's images, for reconciling them with
// their holders.
func (s *Store) Leases() ([]Lease, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "leases"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list image leases: %w", err)
	}
	var out []Lease
	for _, e := range ents {
		holders, err := s.holders(e.Name())
		if err != nil {
			return nil, fmt.Errorf("list image leases: %w", err)
		}
		for _, h := range holders {
			out = append(out, Lease{ManifestDigest: "sha256:" + e.Name(), Holder: h})
		}
	}
	return out, nil
}
