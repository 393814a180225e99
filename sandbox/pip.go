package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/internal/errkind"
	"github.com/flmbox/flmbox/pipcache"
	"github.com/flmbox/flmbox/sandbox/record"
	"github.com/flmbox/flmbox/snippet/wire"
)

// wheelsEnv is pip's environment for the wheel cache mounted at
// pipcacheMount (with no network, no index either).
func (m *Manager) wheelsEnv(online bool) []string {
	return pipcache.SandboxEnv(pipcacheMount, online)
}

// ErrPip is in the error of a pip command that failed in a sandbox (a
// preinstall, a wheel fetch); it is errdefs.ErrFailedPrecondition.
var ErrPip = errkind.New(errdefs.ErrFailedPrecondition, "pip failed: failed precondition")

// preinstall installs reqs in a new sandbox from the wheel cache alone
// (--no-index, whatever the sandbox's network), for Spec.Pip.
func (m *Manager) preinstall(ctx context.Context, rec *record.Record, reqs []string) error {
	if len(reqs) == 0 {
		return nil
	}
	args := append([]string{"install", "--no-index", "--quiet", "--"}, reqs...)
	if err := runPip(ctx, rec, preinstallTimeout, args...); err != nil {
		return fmt.Errorf("preinstall %s from the wheel cache: %w", strings.Join(reqs, " "), err)
	}
	return nil
}

// runPip runs python3 -m pip with args in the sandbox, through its agent,
// and fails with the end of pip's output if pip fails. It is a Python
// snippet, not a shell one: it takes the Python spare that the agent
// started before pip made its directories, so that the next Python
// call, in a process started after pip, imports what pip installed.
func runPip(ctx context.Context, rec *record.Record, timeout time.Duration, args ...string) error {
	req := &wire.Request{Version: wire.ProtocolVersion, Language: Python, Code: pipCode(args),
		TimeoutMS: timeout.Milliseconds(), MaxOutput: 256 << 10}
	res, err := rec.Call(ctx, req)
	switch {
	case err != nil:
		return fmt.Errorf("run pip %s: %w", args[0], err)
	case res.Error != "":
		return fmt.Errorf("run pip %s: %s: %w", args[0], res.Error, errdefs.ErrUnknown)
	case res.TimedOut:
		return fmt.Errorf("pip %s timed out after %s: %w", args[0], timeout, ErrPip)
	case res.ExitCode != 0:
		out := strings.TrimSpace(string(res.Stderr.Data))
		if out == "" {
			out = strings.TrimSpace(string(res.Stdout.Data))
		}
		return fmt.Errorf("pip %s exited with status %d: %s: %w", args[0], res.ExitCode, lastLines(out, 20), ErrPip)
	}
	return nil
}

// pipCode is Python code that runs python3 -m pip with args and exits with
// its status.
func pipCode(args []string) string {
	list, _ := json.Marshal(args) // a JSON array of strings is a Python list literal
	return "import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '-m', 'pip'] + " + string(list) + "))\n"
}

// PipInstall is the call that installs reqs into a sandbox's user site
// from the host's wheel cache alone (pip install --no-index), as Spec.Pip
// does when a sandbox is created; its result is pip's. Requirements are
// checked as Spec.Pip's are (errdefs.ErrInvalidArgument).
func PipInstall(reqs []string) (Request, error) {
	if len(reqs) == 0 {
		return Request{}, fmt.Errorf("no requirement to install: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkRequirements(reqs); err != nil {
		return Request{}, err
	}
	return Request{Language: Python, Code: pipCode(append([]string{"install", "--no-index", "--"}, reqs...)), Timeout: preinstallTimeout}, nil
}

// FetchOptions are how FetchWheels downloads.
type FetchOptions struct {
	// IndexURL is the package index (default: pip's, as the image sets it).
	IndexURL string
	// Timeout bounds pip download. Default: 10 minutes.
	Timeout time.Duration
	// MaxDownloadBytes bounds what pip may download (a tmpfs on the host
	// holds it). Default: 2 GiB.
	MaxDownloadBytes int64
	// Sandbox is the spec of the sandbox pip runs in; its Network is always
	// host, and it gets the download directory, read-write.
	Sandbox Spec
}

// fetchMount is where pip download writes in the fetch sandbox: the
// cache's inbox, a bounded tmpfs on the host.
const fetchMount = "/dev/.flmbox/fetch"

// FetchWheels downloads the wheels of reqs (and their dependencies) with pip
// download in a fresh host-network sandbox of o.Sandbox.Image, so that they
// fit the image's Python and platform, and no package code runs; removes the
// sandbox, then adds the wheels to the wheel cache, validated as
// pipcache.Cache.Add validates them.
func (m *Manager) FetchWheels(ctx context.Context, reqs []string, o FetchOptions) ([]*pipcache.Wheel, error) {
	if len(reqs) == 0 {
		return nil, fmt.Errorf("fetch wheels: no requirement: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkRequirements(reqs); err != nil {
		return nil, err
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.MaxDownloadBytes == 0 {
		o.MaxDownloadBytes = 2 << 30
	}
	cache, err := m.WheelCache()
	if err != nil {
		return nil, err
	}
	inbox, err := cache.NewInbox(o.MaxDownloadBytes, UID, GID)
	if err != nil {
		return nil, err
	}
	defer inbox.Close()
	spec := o.Sandbox
	spec.Network = NetworkHost
	spec.fetch = inbox.Dir // inside the state root: not a Spec.Mounts
	sb, err := m.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	remove := func() error { return m.Remove(context.WithoutCancel(ctx), sb.Name) }
	defer remove() // on failure; a second removal is a no-op
	args := []string{"download", "--only-binary=:all:", "--no-cache-dir", "--progress-bar=off", "--dest", fetchMount}
	if o.IndexURL != "" {
		args = append(args, "--index-url", o.IndexURL)
	}
	rec, err := record.Read(m.root, sb.Name)
	if err != nil {
		return nil, err
	}
	if err := runPip(ctx, rec, o.Timeout, append(append(args, "--"), reqs...)...); err != nil {
		return nil, fmt.Errorf("fetch %s: %w", strings.Join(reqs, " "), err)
	}
	// Nothing may write the inbox while it is imported.
	if err := remove(); err != nil {
		return nil, err
	}
	return cache.AddInbox(ctx, inbox)
}
