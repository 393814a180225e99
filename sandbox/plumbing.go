package sandbox

import (
	"context"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/flmbox/flmbox/runtime"
)

// Plumbing is what flmbox's own fronts need of a Manager beyond what an
// embedder does: the flmbox command's pool hints (PoolKey) and pool refills
// run as processes of their own (Refill), and what flmbox bench measures
// runsc itself with (RunscArgs, BareSpec). An embedder needs none of it.
type Plumbing struct{ m *Manager }

// Plumbing returns the Manager's plumbing.
func (m *Manager) Plumbing() Plumbing { return Plumbing{m: m} }

// PoolKey returns the key of the shape of the sandboxes spec makes (Pool's
// Shape, and their records') and whether a pool of that shape has
// settings. The image is found in the cache (a digest reference needs
// no registry) or pulled, as Acquire does.
func (p Plumbing) PoolKey(ctx context.Context, spec Spec) (key string, pooled bool, err error) {
	return p.m.poolKey(ctx, spec)
}

// Refill makes new sandboxes for the pool of shape until it holds its size,
// unless another refill of that pool is at work (then it returns nil at
// once: at most one refill per pool at a time). The sandboxes are made two
// at a time and belong to this process until they are parked, so that a
// refill killed midway leaves nothing to anyone but Reconcile. It is what a
// Manager's refill (WithRefill) runs.
func (p Plumbing) Refill(ctx context.Context, shape string) error { return p.m.refillPool(ctx, shape) }

// RunscArgs returns the arguments of a runsc command on sandbox sb: runsc's
// global flags as flmbox passes them on every call of the sandbox, then
// args; and the runsc binary. It is for tools and measurements that run
// runsc themselves (runsc exec, with the sandbox's ID).
func (p Plumbing) RunscArgs(sb *Sandbox, args ...string) (runsc string, argv []string, err error) {
	rt, err := p.m.runtime()
	if err != nil {
		return "", nil, err
	}
	c := runtime.Container{ID: sb.ID, Network: runscNetwork(sb.Network), Platform: sb.Platform}
	return rt.Runsc(), rt.Args(c, args...), nil
}

// BareSpec returns the OCI runtime spec of a bare runsc container that is
// made as a sandbox of spec is (the unpacked image at rootfsDir read-only, a
// /tmp, the sandbox's environment from the image's imageEnv, its network and
// limits) but runs argv as the snippets' user instead of flmbox's agent, and
// has none of the agent's mounts: the baseline that measurements of flmbox
// compare a sandbox with.
func (Plumbing) BareSpec(spec Spec, rootfsDir string, imageEnv []string, argv ...string) (*specs.Spec, error) {
	return bareSpec(spec, rootfsDir, imageEnv, argv...)
}
