// Package mcpserver serves flmbox's sandboxes to agents over the Model
// Context Protocol, with the official Go SDK: tools to run code in a fresh
// sandbox or in a session (a sandbox whose /tmp lives across calls), whose
// bounds the operator sets, not the model. Each client connection gets a
// server of its own: its sessions are its own, and go when it goes.
package mcpserver

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/flmbox/flmbox/sandbox"
)

// Options are the operator's bounds for every tool call.
type Options struct {
	// Spec is the sandboxes' shape: image, limits, network. No call asks
	// for more.
	Spec sandbox.Spec
	// MaxTimeout bounds a call's timeout_seconds. Default
	// sandbox.DefaultTimeout.
	MaxTimeout time.Duration
	// MaxSessions bounds one client's sessions. Default DefaultMaxSessions.
	MaxSessions int
	// Version is the server's, as the client is told.
	Version string
	// SessionIdle removes a session that no tool call has used for this
	// long (0: never), checked every SessionIdle/4 (at least a second).
	SessionIdle time.Duration
}

// DefaultMaxSessions bounds one client's sessions unless Options say.
const DefaultMaxSessions = 4

// Conn is the server of one client connection and the sessions it made.
type Conn struct {
	m *sandbox.Manager
	o Options

	mu       sync.Mutex
	sessions map[string]*sandbox.Sandbox // by name; nil while it is made
	used     map[string]time.Time        // when each session was last used
	busy     map[string]int              // calls using each session now
	closed   bool
	stop     chan struct{} // closed by Close: the idle sweep ends
}

// NewConn returns the server of one client connection. Close removes its
// sessions.
func NewConn(m *sandbox.Manager, o Options) *Conn {
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = sandbox.DefaultTimeout
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	c := &Conn{m: m, o: o, sessions: map[string]*sandbox.Sandbox{}, used: map[string]time.Time{}, busy: map[string]int{}, stop: make(chan struct{})}
	if o.SessionIdle > 0 {
		go c.sweepIdle()
	}
	return c
}

// sweepIdle removes the sessions idle for Options.SessionIdle, until Close.
func (c *Conn) sweepIdle() {
	t := time.NewTicker(max(c.o.SessionIdle/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		var idle []*sandbox.Sandbox
		for name, sb := range c.sessions {
			if sb != nil && c.busy[name] == 0 && time.Since(c.used[name]) > c.o.SessionIdle {
				idle = append(idle, sb)
				delete(c.sessions, name)
				delete(c.used, name)
			}
		}
		c.mu.Unlock()
		for _, sb := range idle {
			sb.Remove(context.Background())
		}
	}
}

// Server returns the MCP server of c, with its tools.
func (c *Conn) Server() *mcp.Server { return c.server(nil) }

// server is Server with opts.
func (c *Conn) server(opts *mcp.ServerOptions) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "flmbox", Version: c.o.Version}, opts)
	mcp.AddTool(s, &mcp.Tool{Name: "run_code", Description: "Run Python or shell code in a gVisor sandbox and return its stdout, " +
		"stderr and exit code. Without a session, the code runs in a fresh sandbox that is removed afterwards; with a session " +
		"(create_session), files under /tmp stay between calls. Only /tmp is writable; pip installs into it."}, c.runCode)
	mcp.AddTool(s, &mcp.Tool{Name: "create_session", Description: "Create a session: a sandbox of its own whose /tmp keeps " +
		"its files between run_code calls that name it. End it with end_session when done."}, c.createSession)
	mcp.AddTool(s, &mcp.Tool{Name: "list_sessions", Description: "List this client's sessions."}, c.listSessions)
	mcp.AddTool(s, &mcp.Tool{Name: "end_session", Description: "End a session: its sandbox and files are removed."}, c.endSession)
	mcp.AddTool(s, &mcp.Tool{Name: "install_packages", Description: "Install Python packages into a session with pip, " +
		"from the wheels this host keeps (no package index is reached): they import in the session's later calls. " +
		"Returns pip's output; a package the host has no wheel for fails, saying so."}, c.installPackages)
	c.addFileTools(s)
	return s
}

// Close removes c's sessions; a later tool call fails.
func (c *Conn) Close(ctx context.Context) error {
	c.mu.Lock()
	if !c.closed {
		close(c.stop)
	}
	c.closed = true
	sessions := c.sessions
	c.sessions = map[string]*sandbox.Sandbox{}
	c.mu.Unlock()
	var errs []error
	for _, sb := range sessions {
		if sb == nil {
			continue // being made: its create removes it, finding c closed
		}
		if err := sb.Remove(ctx); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RunCodeIn is run_code's input.
type RunCodeIn struct {
	Language       string  `json:"language,omitempty" jsonschema:"python (the default) or shell"`
	Code           string  `json:"code" jsonschema:"the code to run"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"how long the code may run before it is killed (default and most: the server's)"`
	Session        string  `json:"session,omitempty" jsonschema:"a session from create_session, whose /tmp keeps its files; without one, a fresh sandbox"`
	ImagesDir      string  `json:"images_dir,omitempty" jsonschema:"a directory under /tmp: the PNG, JPEG, GIF and SVG files the code writes there (matplotlib's savefig, say) come back as images"`
}

// RunCodeOut is run_code's structured result.
type RunCodeOut struct {
	ExitCode   int     `json:"exit_code" jsonschema:"the code's exit status (137 when killed)"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Ended      string  `json:"ended" jsonschema:"how it ended: exited, timeout, oom or signaled"`
	Truncated  bool    `json:"truncated,omitempty" jsonschema:"the middle of stdout or stderr was left out"`
	DurationMS float64 `json:"duration_ms"`
	Images     int     `json:"images,omitempty" jsonschema:"how many images of images_dir came back"`
}

// request is in's call, its timeout at most limit.
func (in RunCodeIn) request(limit time.Duration) (sandbox.Request, error) {
	req := sandbox.Request{Language: cmp.Or(in.Language, "python"), Code: in.Code, Timeout: limit}
	switch {
	case req.Language != "python" && req.Language != "shell":
		return req, fmt.Errorf("language %q: use python or shell", in.Language)
	case in.TimeoutSeconds < 0:
		return req, fmt.Errorf("timeout_seconds %v: use a positive number of seconds", in.TimeoutSeconds)
	case in.TimeoutSeconds > 0:
		req.Timeout = min(limit, time.Duration(in.TimeoutSeconds*float64(time.Second)))
	}
	if in.ImagesDir != "" {
		if err := underTmp(in.ImagesDir); err != nil {
			return req, fmt.Errorf("images_dir: %w", err)
		}
	}
	return req, nil
}

func (c *Conn) runCode(ctx context.Context, treq *mcp.CallToolRequest, in RunCodeIn) (*mcp.CallToolResult, RunCodeOut, error) {
	var out RunCodeOut
	req, err := in.request(c.o.MaxTimeout)
	if err != nil {
		return nil, out, err
	}
	var sb *sandbox.Sandbox
	if in.Session != "" {
		s, done, ok := c.session(in.Session)
		if !ok {
			return nil, out, fmt.Errorf("no session %q: create_session makes one, list_sessions lists this client's", in.Session)
		}
		defer done()
		sb = s
	}
	start := time.Now()
	// A client that asked for progress hears how long the call has run,
	// every progressEvery; one that cancels the request (MCP's
	// notifications/cancelled ends ctx) stops the code, as Ctrl-C does.
	if treq != nil && treq.Params != nil && treq.Session != nil {
		if token := treq.Params.GetProgressToken(); token != nil {
			stop := progress(ctx, treq.Session, token, start)
			defer stop()
		}
	}
	if sb == nil && in.ImagesDir != "" {
		// A sandbox of its own, to read the images from before it goes.
		if sb, err = c.m.Acquire(ctx, c.o.Spec); err != nil {
			return nil, out, oneLine(err)
		}
		defer sb.Release(context.WithoutCancel(ctx))
	}
	if in.ImagesDir != "" {
		if err := ensureDir(ctx, sb, in.ImagesDir); err != nil {
			return nil, out, fmt.Errorf("images_dir %s: %w", in.ImagesDir, oneLine(err))
		}
	}
	var res *sandbox.Result
	if sb == nil {
		res, err = c.m.RunOnce(ctx, c.o.Spec, req)
	} else {
		res, err = sb.Call(ctx, req)
	}
	if err != nil {
		return nil, out, oneLine(err)
	}
	out = outOf(res)
	var b strings.Builder
	b.WriteString(out.Stdout)
	if out.Stderr != "" {
		fmt.Fprintf(&b, "\n[stderr]\n%s", out.Stderr)
	}
	fmt.Fprintf(&b, "\n[exit code %d, %s]", out.ExitCode, out.Ended)
	content := []mcp.Content{&mcp.TextContent{Text: b.String()}}
	if in.ImagesDir != "" {
		images, note := readImages(ctx, sb, in.ImagesDir, start)
		content = append(content, images...)
		if note != "" {
			content = append(content, &mcp.TextContent{Text: note})
		}
		out.Images = len(images)
	}
	return &mcp.CallToolResult{Content: content}, out, nil
}

// progressEvery is how often a call tells a client that asked how long it
// has run.
const progressEvery = time.Second

// progress notifies session of the call's elapsed time every
// progressEvery, until stop is called.
func progress(ctx context.Context, session *mcp.ServerSession, token any, start time.Time) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				s := time.Since(start).Seconds()
				session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: s,
					Message: fmt.Sprintf("running for %.0f s", s)})
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// outOf is a call's result as a tool returns it.
func outOf(res *sandbox.Result) RunCodeOut {
	return RunCodeOut{ExitCode: res.ExitCode, Stdout: text(res.Stdout), Stderr: text(res.Stderr), Ended: ended(res),
		Truncated: res.Stdout.Truncated || res.Stderr.Truncated, DurationMS: float64(res.Duration.Microseconds()) / 1000}
}

// text is what a stream held, as text: with the middle left out marked.
func text(o sandbox.Output) string {
	if !o.Truncated {
		return string(o.Data)
	}
	return fmt.Sprintf("%s\n[… %d bytes left out …]\n%s", o.Data, o.Total-int64(len(o.Data))-int64(len(o.Tail)), o.Tail)
}

// ended says how a call ended.
func ended(res *sandbox.Result) string {
	switch {
	case res.TimedOut:
		return "timeout"
	case res.OOMKilled:
		return "oom"
	case res.Signal != "":
		return "signaled"
	}
	return "exited"
}

// InstallIn is install_packages's input.
type InstallIn struct {
	Session  string   `json:"session" jsonschema:"the session, as create_session returned it"`
	Packages []string `json:"packages" jsonschema:"pip requirements, such as pandas or numpy>=2"`
}

func (c *Conn) installPackages(ctx context.Context, _ *mcp.CallToolRequest, in InstallIn) (*mcp.CallToolResult, RunCodeOut, error) {
	sb, done, ok := c.session(in.Session)
	if !ok {
		return nil, RunCodeOut{}, fmt.Errorf("no session %q: create_session makes one", in.Session)
	}
	defer done()
	req, err := sandbox.PipInstall(in.Packages)
	if err != nil {
		return nil, RunCodeOut{}, oneLine(err)
	}
	req.Timeout = min(req.Timeout, c.o.MaxTimeout)
	res, err := sb.Call(ctx, req)
	if err != nil {
		return nil, RunCodeOut{}, oneLine(err)
	}
	return nil, outOf(res), nil
}

// SessionOut names a session.
type SessionOut struct {
	Session string `json:"session"`
}

// SessionIn names a session.
type SessionIn struct {
	Session string `json:"session" jsonschema:"the session, as create_session returned it"`
}

// SessionsOut lists sessions.
type SessionsOut struct {
	Sessions []string `json:"sessions"`
}

func (c *Conn) createSession(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, SessionOut, error) {
	c.mu.Lock()
	if c.closed || len(c.sessions) >= c.o.MaxSessions {
		n := len(c.sessions)
		c.mu.Unlock()
		return nil, SessionOut{}, fmt.Errorf("this client has %d sessions, the most it may have: end one with end_session", n)
	}
	var id [6]byte
	rand.Read(id[:])
	name := "mcp-" + hex.EncodeToString(id[:])
	c.sessions[name] = nil // held while it is made, so that no other create passes the bound
	c.mu.Unlock()
	spec := c.o.Spec
	spec.Name = name
	sb, err := c.m.Create(ctx, spec)
	c.mu.Lock()
	closed := c.closed
	if err != nil || closed {
		delete(c.sessions, name)
	} else {
		c.sessions[name], c.used[name] = sb, time.Now()
	}
	c.mu.Unlock()
	switch {
	case err != nil:
		return nil, SessionOut{}, oneLine(err)
	case closed:
		sb.Remove(context.WithoutCancel(ctx))
		return nil, SessionOut{}, errors.New("the client went")
	}
	return nil, SessionOut{Session: name}, nil
}

func (c *Conn) listSessions(_ context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, SessionsOut, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return nil, SessionsOut{Sessions: append([]string{}, slices.Sorted(maps.Keys(c.sessions))...)}, nil
}

func (c *Conn) endSession(ctx context.Context, _ *mcp.CallToolRequest, in SessionIn) (*mcp.CallToolResult, SessionOut, error) {
	sb, done, ok := c.session(in.Session)
	if !ok {
		return nil, SessionOut{}, fmt.Errorf("no session %q: list_sessions lists this client's", in.Session)
	}
	done()
	c.mu.Lock()
	delete(c.sessions, in.Session)
	delete(c.used, in.Session)
	delete(c.busy, in.Session)
	c.mu.Unlock()
	if err := sb.Remove(ctx); err != nil && !errdefs.IsNotFound(err) {
		return nil, SessionOut{}, oneLine(err)
	}
	return nil, SessionOut{Session: in.Session}, nil
}

// session returns the sandbox of c's session id, used until done is
// called: no idle sweep removes it meanwhile.
func (c *Conn) session(id string) (sb *sandbox.Sandbox, done func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb = c.sessions[id]
	if sb == nil || c.closed {
		return nil, nil, false
	}
	c.used[id] = time.Now()
	c.busy[id]++
	return sb, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.busy[id]--
		c.used[id] = time.Now()
	}, true
}

// oneLine is err's first line, for a model to read.
func oneLine(err error) error {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return errors.New(s)
}

// ServeStdio serves one client over stdin and stdout until it goes or ctx
// ends, then removes its sessions.
func ServeStdio(ctx context.Context, m *sandbox.Manager, o Options) error {
	c := NewConn(m, o)
	err := c.Server().Run(ctx, &mcp.StdioTransport{})
	if cerr := c.Close(context.WithoutCancel(ctx)); cerr != nil {
		return errors.Join(err, cerr)
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
