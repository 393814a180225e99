package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"github.com/flmbox/flmbox/internal/stateroot"
	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/rootfs"
	"github.com/flmbox/flmbox/runtime"
)

// Manager creates, calls and removes the sandboxes under one state root:
//
//	ROOT/images/       the image cache (package rootfs)
//	ROOT/pipcache/     the wheel cache (package pipcache)
//	ROOT/sandboxes/    one directory per sandbox (this package)
//	ROOT/runsc/        runsc's state (its --root)
//
// A Manager is safe for concurrent use, and so are several processes
// sharing one root.
type Manager struct {
	root string
	o    options

	mu     sync.Mutex // guards what open sets
	store  *rootfs.Store
	wheels *pipcache.Cache
	rt     *runtime.Runtime

	bg sync.WaitGroup // work left running in the background (Wait, Close)
	// life is cancelled by Close: the background work the Manager
	// started (its pools' refills) stops, and none starts after.
	life  context.Context
	close context.CancelFunc
}

type options struct {
	runsc string
	agent string
	// resolver is the egress resolver binary (WithResolver).
	resolver string
	warnf    func(format string, args ...any)
	debugf   func(format string, args ...any)
	wheels   *pipcache.Cache
	// refiller starts a refill of a pool (WithRefill); nil: a goroutine.
	refiller func(shape string)
}

// Option configures a Manager.
type Option func(*options)

// WithRunsc names the runsc binary. Default: runsc on PATH.
func WithRunsc(path string) Option { return func(o *options) { o.runsc = path } }

// WithAgent names the agent binary (cmd/flmbox-agent) that every sandbox
// runs as its first process. Default: flmbox-agent in the directory of the
// running executable.
func WithAgent(path string) Option { return func(o *options) { o.agent = path } }

// WithWarnf sets where warnings go (a sandbox that could not be removed
// after a batch, an image entry skipped while unpacking). Default: none.
func WithWarnf(f func(format string, args ...any)) Option { return func(o *options) { o.warnf = f } }

// WithDebugf sets where the whole of what runsc said about a failure goes
// (its panics, urpc messages, stack traces), which an error quotes one line
// of, naming the log file that keeps the rest. Default: none.
func WithDebugf(f func(format string, args ...any)) Option { return func(o *options) { o.debugf = f } }

// WithWheelCache sets the wheel cache that sandboxes install Python packages
// from. Default: the one under ROOT/pipcache.
func WithWheelCache(c *pipcache.Cache) Option { return func(o *options) { o.wheels = c } }

// Open returns the Manager of the sandboxes under root. It creates nothing
// and starts nothing: the caches and runsc are opened when first needed, so
// that a call to a running sandbox costs no more than the call. A relative
// root is taken against the working directory at Open, once: runsc is
// handed paths under it (a bundle's rootfs, its own state), which it needs
// absolute, and a later chdir does not move the sandboxes.
func Open(root string, opts ...Option) (*Manager, error) {
	if root == "" {
		return nil, fmt.Errorf("open sandboxes: no state root: %w", errdefs.ErrInvalidArgument)
	}
	root, err := filepath.Abs(root)
	if err != nil { // the working directory is gone
		return nil, fmt.Errorf("open sandboxes: state root: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	m := &Manager{root: root}
	m.life, m.close = context.WithCancel(context.Background())
	for _, opt := range opts {
		opt(&m.o)
	}
	if m.o.warnf == nil {
		m.o.warnf = func(string, ...any) {}
	}
	if m.o.debugf == nil {
		m.o.debugf = func(string, ...any) {}
	}
	if m.o.refiller == nil {
		m.o.refiller = func(shape string) {
			m.background(func(ctx context.Context) {
				if err := m.refillPool(ctx, shape); err != nil && ctx.Err() == nil {
					m.o.warnf("%v", err)
				}
			})
		}
	}
	return m, nil
}

// background runs f in a goroutine of the Manager's, with a context that
// Close cancels, and reports whether it did: after Close, it runs nothing.
func (m *Manager) background(f func(ctx context.Context)) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.life.Err() != nil {
		return false
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		f(m.life)
	}()
	return true
}

// afterwards runs f, which must not be stopped midway (a release), in a
// goroutine of the Manager's that Close and Wait wait for, with a context
// that nothing cancels; after Close, f runs before afterwards returns.
func (m *Manager) afterwards(f func(ctx context.Context)) {
	m.mu.Lock()
	closed := m.life.Err() != nil
	if !closed {
		m.bg.Add(1)
	}
	m.mu.Unlock()
	if closed {
		f(context.Background())
		return
	}
	go func() {
		defer m.bg.Done()
		f(context.Background())
	}()
}

// Close stops the work the Manager started in the background (its pools'
// refills: a refill stopped midway leaves its unparked sandboxes to
// Reconcile) and waits for it and for what Wait waits for, until ctx is
// done. The sandboxes stay; the Manager's methods still work, but start
// nothing in the background.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.close()
	m.mu.Unlock()
	done := make(chan struct{})
	go func() {
		m.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close the sandboxes' manager: its background work did not end: %w", ctx.Err())
	}
}

// Wait waits for the work that the Manager's calls left running in the
// background: the releases of RunOnce's sandboxes, and the removal of a
// resumed sandbox's checkpoint image, which its first call need not wait
// for. A process that exits without waiting leaves a sandbox to Reconcile,
// and an image to the sandbox's next suspend, or to Reconcile.
func (m *Manager) Wait() { m.bg.Wait() }

// Root is the Manager's state root.
func (m *Manager) Root() string { return m.root }

// open opens the state root's caches, until it succeeds (a failure, such
// as a full disk, is not remembered).
func (m *Manager) open() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.store != nil {
		return nil
	}
	if err := os.MkdirAll(stateroot.Sandboxes(m.root), 0o700); err != nil {
		return fmt.Errorf("create the state root %s: %w", m.root, err)
	}
	store, err := rootfs.OpenStore(stateroot.Images(m.root), rootfs.WithMountPoints(mountPoints...))
	if err != nil {
		return err
	}
	wheels := m.o.wheels
	if wheels == nil {
		if wheels, err = pipcache.Open(stateroot.Pipcache(m.root), nil); err != nil {
			return err
		}
	}
	m.store, m.wheels = store, wheels
	return nil
}

// runtime returns the runsc driver, finding runsc until it is found (it may
// be installed after the Manager was opened).
func (m *Manager) runtime() (*runtime.Runtime, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rt != nil {
		return m.rt, nil
	}
	runsc, err := runtime.FindRunsc(m.o.runsc)
	if err != nil {
		return nil, err
	}
	if m.rt, err = runtime.NewRuntime(runsc, stateroot.Runsc(m.root)); err != nil {
		return nil, err
	}
	return m.rt, nil
}

// Images returns the image cache under the state root. The trees it
// unpacks have the mount points of sandboxes' bind mounts, so that runsc
// never makes them in a tree that sandboxes share.
func (m *Manager) Images() (*rootfs.Store, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	return m.store, nil
}

// WheelCache returns the wheel cache sandboxes install from.
func (m *Manager) WheelCache() (*pipcache.Cache, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	return m.wheels, nil
}

// AgentName is the agent binary's file name.
const AgentName = "flmbox-agent"

// ErrNoAgent is in the error of a Manager that cannot find its agent
// binary; it is errdefs.ErrNotFound.
var ErrNoAgent = errkind.New(errdefs.ErrNotFound, "no agent binary")

// agentError is a failure to find the agent: its message says where it was
// looked for and why it failed; it is ErrNoAgent.
type agentError struct {
	msg string
	err error
}

func (e *agentError) Error() string   { return e.msg }
func (e *agentError) Unwrap() []error { return []error{e.err, ErrNoAgent} }

// Agent returns the agent binary every sandbox runs, after checking that it
// is an executable file (ErrNoAgent otherwise).
func (m *Manager) Agent() (string, error) {
	p, where := m.o.agent, "at "+m.o.agent
	if p == "" {
		self, err := os.Executable()
		if err != nil {
			return "", &agentError{fmt.Sprintf("find %s, the sandboxes' agent: %v", AgentName, err), err}
		}
		p, where = filepath.Join(filepath.Dir(self), AgentName), "next to "+self
	}
	fi, err := os.Stat(p)
	if err == nil && (!fi.Mode().IsRegular() || fi.Mode()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		return "", &agentError{fmt.Sprintf("find %s, the sandboxes' agent, %s: %v", AgentName, where, err), err}
	}
	return p, nil
}
