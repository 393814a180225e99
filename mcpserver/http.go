package mcpserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/flmbox/flmbox/sandbox"
)

// HTTPOptions are what ServeHTTP adds to Options.
type HTTPOptions struct {
	// Token, if set, is the bearer token every request must carry
	// (Authorization: Bearer TOKEN); others are refused with 401.
	Token string
	// SessionIdle ends a client's MCP session, and removes its sessions'
	// sandboxes, once it has sent nothing for this long (0: never).
	SessionIdle time.Duration
}

// ServeHTTP serves clients over MCP's streamable HTTP on ln, at any path,
// until ctx ends; then it removes every client's sessions. Each client (MCP
// session) gets a Conn of its own, closed when its session ends: the client
// deletes it, or it was idle for h.SessionIdle. The SDK's DNS-rebinding
// protection is on: a request to a loopback address that names another
// host is refused.
func ServeHTTP(ctx context.Context, m *sandbox.Manager, o Options, h HTTPOptions, ln net.Listener) error {
	var mu sync.Mutex
	conns := map[*Conn]bool{}
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
		c := NewConn(m, o)
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		return c.server(&mcp.ServerOptions{InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) {
			go func() {
				req.Session.Wait()
				c.Close(context.WithoutCancel(ctx))
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}})
	}, &mcp.StreamableHTTPOptions{SessionTimeout: h.SessionIdle})
	srv := &http.Server{Handler: bearer(h.Token, handler), ReadHeaderTimeout: 30 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		srv.Shutdown(sctx)
		cancel()
		<-done
	}
	mu.Lock()
	open := make([]*Conn, 0, len(conns))
	for c := range conns {
		open = append(open, c)
	}
	mu.Unlock()
	var errs []error
	for _, c := range open {
		errs = append(errs, c.Close(context.WithoutCancel(ctx)))
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(append(errs, err)...)
}

// bearer refuses requests without token as their bearer token, unless token
// is empty.
func bearer(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="flmbox mcp"`)
			http.Error(w, "a bearer token is needed (the one of flmbox mcp --token-file)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
