package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/atomicfile"
	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// shape is everything a sandbox is made of, its defaults filled in: two
// sandboxes of one shape, once reset, cannot be told apart by a snippet, so
// either may serve whoever asks for that shape. The image is its manifest
// (the tree it runs), not its reference; the agent's protocol is in it so
// that a pool never hands out a sandbox of another flmbox.
type shape struct {
	Manifest string        `json:"manifest"`
	Network  string        `json:"network"`
	Egress   *Egress       `json:"egress,omitempty"`
	Platform string        `json:"platform,omitempty"`
	Limits   record.Limits `json:"limits"`
	TmpBytes int64         `json:"tmp_bytes"`
	Env      []string      `json:"env,omitempty"`
	Pip      []string      `json:"pip,omitempty"`
	Mounts   []Mount       `json:"mounts,omitempty"`
	Protocol int           `json:"protocol"`
	// LazySpares is Spec.LazySpares.
	LazySpares bool `json:"lazy_spares,omitempty"`
	// Fetch marks FetchWheels' sandboxes, which have a download directory.
	Fetch bool `json:"fetch,omitempty"`
	// Agent identifies the agent binary (its size and modification time):
	// a sandbox runs the agent it was made with, so a pool never hands out
	// one of an earlier build.
	Agent string `json:"agent"`
}

// shapeOf is the shape of the sandboxes spec (its defaults filled in) makes
// from the image whose manifest is manifest with the Manager's agent.
func (m *Manager) shapeOf(spec Spec, manifest string) (shape, error) {
	agent, err := m.Agent()
	if err != nil {
		return shape{}, err
	}
	fi, err := os.Stat(agent)
	if err != nil {
		return shape{}, fmt.Errorf("agent: %w", err)
	}
	return shapeFrom(spec, manifest, agentID(fi)), nil
}

// agentID identifies an agent binary by its size and modification time.
func agentID(fi os.FileInfo) string { return fmt.Sprintf("%d-%d", fi.Size(), fi.ModTime().UnixNano()) }

// shapeFrom is the shape of the sandboxes spec makes from the image of
// manifest with the agent of agentID.
func shapeFrom(spec Spec, manifest, agentID string) shape {
	var e *Egress
	if spec.Network == NetworkEgress {
		e = &spec.Egress
	}
	return shape{Egress: e, Manifest: manifest, Network: string(spec.Network), Platform: spec.Platform,
		Limits: record.Limits(spec.Limits), TmpBytes: spec.TmpBytes, Env: spec.Env, Pip: spec.Pip,
		Mounts: spec.Mounts, Protocol: wire.ProtocolVersion, Agent: agentID, LazySpares: spec.LazySpares, Fetch: spec.fetch != ""}
}

// key names the shape: 16 hex digits of the SHA-256 of its JSON.
func (s shape) key() string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // only strings and numbers
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// spec is a Spec that makes sandboxes of the shape from image.
func (s shape) spec(image string) Spec {
	var e Egress
	if s.Egress != nil {
		e = *s.Egress
	}
	return Spec{Image: image, Network: Network(s.Network), Egress: e, Platform: s.Platform, Limits: Limits(s.Limits),
		TmpBytes: s.TmpBytes, Env: s.Env, Pip: s.Pip, Mounts: s.Mounts, LazySpares: s.LazySpares}
}

// DefaultIdleTimeout is how long a sandbox stays idle in a pool, by
// default, before it is removed.
const DefaultIdleTimeout = 30 * time.Minute

// MaxPoolSize is the largest pool of one shape.
const MaxPoolSize = 256

// PoolOptions are the settings of a shape's pool, kept under the state
// root (ROOT/pool/SHAPE.json) until the pool is drained.
type PoolOptions struct {
	// Size is how many idle sandboxes the pool keeps, 0 to MaxPoolSize. A
	// sandbox released while its pool holds Size idle ones is removed.
	Size int
	// IdleTimeout is how long a sandbox may stay idle in the pool before
	// it is removed. Default: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Parallel is how many sandboxes FillPool makes at once. Default: the
	// number of CPUs.
	Parallel int
}

// poolConfig is ROOT/pool/SHAPE.json: what a refill needs to make the
// shape's sandboxes, and the pool's settings.
type poolConfig struct {
	Image       string        `json:"image"` // as given to the fill that set the size
	Shape       shape         `json:"shape"`
	Size        int           `json:"size"`
	IdleTimeout time.Duration `json:"idle_timeout"`
}

func (m *Manager) poolPath(key, ext string) string {
	return filepath.Join(stateroot.Pool(m.root), key+ext)
}

// readPool reads the settings of the pool of shape key; nil if it has none
// (its size is 0).
func (m *Manager) readPool(key string) *poolConfig {
	if key == "" {
		return nil
	}
	b, err := os.ReadFile(m.poolPath(key, ".json"))
	if err != nil {
		return nil
	}
	c := &poolConfig{}
	if err := json.Unmarshal(b, c); err != nil {
		m.o.warnf("pool %s: its settings are damaged (%v): ignoring them until the pool is filled again", key, err)
		return nil
	}
	if c.Shape.key() != key {
		return nil // written by another flmbox, whose shapes hold other fields
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	return c
}

// writePool writes c atomically.
func (m *Manager) writePool(key string, c *poolConfig) error {
	if err := os.MkdirAll(stateroot.Pool(m.root), 0o700); err != nil {
		return fmt.Errorf("write pool %s: %w", key, err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	p := m.poolPath(key, ".json")
	if err := atomicfile.WriteFile(p, b, 0o600); err != nil {
		return fmt.Errorf("write pool %s: %w", key, err)
	}
	return nil
}

// poolKeys are the shapes that have settings.
func (m *Manager) poolKeys() []string {
	ents, _ := os.ReadDir(stateroot.Pool(m.root))
	var keys []string
	for _, e := range ents {
		if k, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// checkPoolOptions refuses sizes out of bounds and negative timeouts.
func checkPoolOptions(o PoolOptions) error {
	if o.Size < 0 || o.Size > MaxPoolSize {
		return fmt.Errorf("pool size %d: want 0 to %d: %w", o.Size, MaxPoolSize, errdefs.ErrInvalidArgument)
	}
	if o.IdleTimeout < 0 {
		return fmt.Errorf("pool idle timeout %s: want a positive duration: %w", o.IdleTimeout, errdefs.ErrInvalidArgument)
	}
	return nil
}
