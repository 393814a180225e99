package mcpserver

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flmbox/flmbox/sandbox"
)

func TestUnderTmp(t *testing.T) {
	for p, ok := range map[string]bool{
		"/tmp/x": true, "/tmp/a/b.png": true, "/tmp/../tmp/x": true,
		"/tmp": false, "/tmp/": false, "tmp/x": false, "/etc/passwd": false, "/tmp/../etc/passwd": false, "/tmpx/y": false, "": false,
	} {
		if err := underTmp(p); (err == nil) != ok {
			t.Errorf("underTmp(%q) = %v, want ok %v", p, err, ok)
		}
	}
}

func TestTextAndEnded(t *testing.T) {
	whole := sandbox.Output{Data: []byte("all of it\n"), Total: 10}
	if got := text(whole); got != "all of it\n" {
		t.Errorf("text of a whole output: %q", got)
	}
	cut := sandbox.Output{Data: []byte("head"), Tail: []byte("tail"), Total: 100, Truncated: true}
	if got := text(cut); got != "head\n[… 92 bytes left out …]\ntail" {
		t.Errorf("text of a truncated output: %q", got)
	}
	for want, res := range map[string]*sandbox.Result{
		"exited": {ExitCode: 3}, "timeout": {TimedOut: true, Signal: "SIGKILL"}, "oom": {OOMKilled: true, Signal: "SIGKILL"}, "signaled": {Signal: "SIGTERM"},
	} {
		if got := ended(res); got != want {
			t.Errorf("ended(%+v) = %q, want %q", res, got, want)
		}
	}
}

func TestBearer(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, tc := range []struct {
		token, header string
		want          int
	}{
		{"", "", http.StatusNoContent},
		{"t0k", "Bearer t0k", http.StatusNoContent},
		{"t0k", "", http.StatusUnauthorized},
		{"t0k", "Bearer t0", http.StatusUnauthorized},
		{"t0k", "bearer t0k", http.StatusUnauthorized},
		{"t0k", "Bearer t0k ", http.StatusUnauthorized},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader("{}"))
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		bearer(tc.token, ok).ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("token %q, Authorization %q: %d, want %d", tc.token, tc.header, rec.Code, tc.want)
		}
	}
}
