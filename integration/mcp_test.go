//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mcpClientDir is where make installs the official MCP TypeScript client
// (Makefile: mcpclient).
const mcpClientDir = "/var/cache/flmbox/mcp-client"

// mcpResult is a tools/call result as the client returns it.
type mcpResult struct {
	Content []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		Data     string `json:"data"`
		MIMEType string `json:"mimeType"`
	} `json:"content"`
	Structured map[string]any `json:"structuredContent"`
	IsError    bool           `json:"isError"`
}

func (r mcpResult) text() string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// TestMCPWithTheOfficialClient drives `flmbox mcp` over stdio with the
// official MCP TypeScript client: the tools and their schemas, a one-shot
// Python and shell call, a session whose /tmp lives across calls, the
// operator's bound on sessions, errors as tool errors an LLM can act on
// (never a dropped connection), a timeout, and the client's sessions
// removed when it goes.
func TestMCPWithTheOfficialClient(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	mustFlmbox(t, root, "pipcache", "add", writeTestWheel(t, t.TempDir(), "flmbox-mcp-wheel", "1.0"))
	stdout := runMCPClient(t, "client.mjs", flmboxBin, "--root", root, "--runsc", runscPath,
		"mcp", "--image", reg.digestRef(), "--max-sessions", "1", "--timeout", "1m")
	var out struct {
		Tools []struct {
			Name, Description string
			Input, Output     map[string]any
		}
		Once, Shell, Session, Write, Read, Second, List, BadSession, BadLanguage, Timeout, End, ListAfter mcpResult
		WriteText, WriteBinary, ReadText, ReadBinary, Listed, Outside, Plot, AfterCancel                  mcpResult
		Install, Imported, InstallMissing, InstallBad                                                     mcpResult
		Cancelled                                                                                         string
		CancelledAfterMS                                                                                  float64
		Progress                                                                                          []struct {
			Progress float64
			Message  string
		}
		Left string
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("the client printed %q: %v", stdout, err)
	}
	var names []string
	for _, tool := range out.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.Input["type"] != "object" || tool.Output["type"] != "object" {
			t.Errorf("tool %s: description %q, input schema %v, output schema %v", tool.Name, tool.Description, tool.Input, tool.Output)
		}
	}
	if slices.Sort(names); !slices.Equal(names, []string{"create_session", "end_session", "install_packages", "list_files", "list_sessions", "read_file", "run_code", "write_file"}) {
		t.Errorf("tools %v", names)
	}
	if r := out.Once; r.IsError || r.Structured["stdout"] != "42\n" || r.Structured["exit_code"] != 0.0 || r.Structured["ended"] != "exited" || !strings.HasPrefix(r.text(), "42\n") {
		t.Errorf("run_code of Python: %+v", r)
	}
	if r := out.Shell; r.IsError || r.Structured["stderr"] != "hi\n" || r.Structured["exit_code"] != 3.0 || !strings.Contains(r.text(), "[exit code 3") {
		t.Errorf("run_code of shell: %+v", r)
	}
	sid, _ := out.Session.Structured["session"].(string)
	if out.Session.IsError || !strings.HasPrefix(sid, "mcp-") {
		t.Fatalf("create_session: %+v", out.Session)
	}
	if r := out.Read; r.IsError || r.Structured["stdout"] != "kept\n" {
		t.Errorf("a session's /tmp across calls: write %+v, read %+v", out.Write, r)
	}
	// Files: text and binary both ways, a listing, a path outside /tmp
	// refused.
	if out.WriteText.IsError || out.WriteBinary.IsError {
		t.Errorf("write_file: %+v, %+v", out.WriteText, out.WriteBinary)
	}
	if r := out.ReadText; r.IsError || r.Structured["content"] != "héllo\n" || r.Structured["encoding"] != "text" {
		t.Errorf("read_file of text: %+v", r)
	}
	if r := out.ReadBinary; r.IsError || r.Structured["content"] != "AP8B/g==" || r.Structured["encoding"] != "base64" {
		t.Errorf("read_file of bytes: %+v", r)
	}
	var listed []string
	entries, _ := out.Listed.Structured["entries"].([]any)
	for _, e := range entries {
		if m, ok := e.(map[string]any); ok {
			listed = append(listed, fmt.Sprint(m["name"], " ", m["type"], " ", m["bytes"]))
		}
	}
	for _, want := range []string{"notes.txt file 7", "blob.bin file 4", "x file 4"} {
		if !slices.Contains(listed, want) {
			t.Errorf("list_files of /tmp: %q, want %q among them", listed, want)
		}
	}
	if r := out.Outside; !r.IsError || !strings.Contains(r.text(), "below /tmp") {
		t.Errorf("write_file of /etc/passwd: %+v", r)
	}
	// Packages from the host's wheel cache.
	if r := out.Imported; out.Install.IsError || out.Install.Structured["exit_code"] != 0.0 || r.Structured["stdout"] != "hello from flmbox-mcp-wheel 1.0\n" {
		t.Errorf("install_packages, then import: %+v, %+v", out.Install, r)
	}
	if r := out.InstallMissing; r.IsError || r.Structured["exit_code"] == 0.0 || !strings.Contains(fmt.Sprint(r.Structured["stderr"]), "no-such-package") {
		t.Errorf("install_packages of a package the host has no wheel for: %+v", r)
	}
	if r := out.InstallBad; !r.IsError || !strings.Contains(r.text(), "pip requirement") {
		t.Errorf("install_packages of an option: %+v", r)
	}
	// The plot came back as an image.
	var images []string
	for _, c := range out.Plot.Content {
		if c.Type == "image" {
			images = append(images, c.MIMEType)
		}
	}
	if out.Plot.IsError || !slices.Equal(images, []string{"image/png"}) || out.Plot.Structured["images"] != 1.0 || out.Plot.Structured["stdout"] != "drawn\n" {
		t.Errorf("run_code with images_dir: %+v", out.Plot)
	}
	if r := out.Second; !r.IsError || !strings.Contains(r.text(), "the most it may have") {
		t.Errorf("a session over --max-sessions 1: %+v", r)
	}
	if r := out.List; !slices.Equal(toStrings(r.Structured["sessions"]), []string{sid}) {
		t.Errorf("list_sessions: %+v", r)
	}
	for name, r := range map[string]mcpResult{"an unknown session": out.BadSession, "an unknown language": out.BadLanguage} {
		if !r.IsError || strings.Contains(r.text(), "\n") || r.text() == "" {
			t.Errorf("%s: %+v; want a tool error of one line", name, r)
		}
	}
	if r := out.Timeout; r.IsError || r.Structured["ended"] != "timeout" || r.Structured["exit_code"] != 137.0 {
		t.Errorf("run_code with timeout_seconds 1: %+v", r)
	}
	// Progress and cancellation.
	if len(out.Progress) != 2 || out.Progress[1].Progress <= out.Progress[0].Progress || !strings.HasPrefix(out.Progress[0].Message, "running for") {
		t.Errorf("progress of a long call: %+v", out.Progress)
	}
	if !strings.Contains(out.Cancelled, "bort") || out.CancelledAfterMS > 30000 {
		t.Errorf("a cancelled call: %q after %.0f ms", out.Cancelled, out.CancelledAfterMS)
	}
	if r := out.AfterCancel; r.IsError || r.Structured["stdout"] != "stopped\n" {
		t.Errorf("the session after a cancelled call: %+v; want the code's process gone", r)
	}
	if r := out.ListAfter; len(toStrings(r.Structured["sessions"])) != 0 || out.End.IsError {
		t.Errorf("after end_session: %+v, %+v", out.End, r)
	}
	// The client went: its session went with it, and nothing else is left.
	if !strings.HasPrefix(out.Left, "mcp-") {
		t.Fatalf("the session left open: %q", out.Left)
	}
	if ls := mustFlmbox(t, root, "sandbox", "ls"); strings.Contains(ls, "mcp-") {
		t.Errorf("sessions outlived their client:\n%s", ls)
	}
}

// runMCPClient runs the client script testdata/mcp/NAME with args under
// node, beside the official TypeScript client's node_modules as a project
// has them, and returns what it printed.
func runMCPClient(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	if _, err := os.Stat(filepath.Join(mcpClientDir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Fatalf("the MCP TypeScript client is not installed (make mcpclient): %v", err)
	}
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("testdata/mcp", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), script, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(mcpClientDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", append([]string{filepath.Join(dir, name)}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the MCP client %s: %v\nstderr: %s", name, err, stderr.String())
	}
	return out
}

// toStrings is a decoded JSON array of strings.
func toStrings(v any) []string {
	var out []string
	xs, _ := v.([]any)
	for _, x := range xs {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// TestMCPOverHTTP serves `flmbox mcp --listen` to the official TypeScript
// client over streamable HTTP: a client without the bearer token is
// refused, one with it runs code and a session, and the session's sandbox
// goes when the client ends its MCP session; a request that names another
// host on the loopback address is refused (DNS rebinding); SIGTERM stops
// the server.
func TestMCPOverHTTP(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Refused before anything listens: no image, no token off loopback, an
	// empty token.
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"mcp", "--listen", "127.0.0.1:0"}, "needs --image"},
		{[]string{"mcp", "--image", reg.digestRef(), "--listen", "0.0.0.0:0"}, "without a token"},
		{[]string{"mcp", "--image", reg.digestRef(), "--listen", "127.0.0.1:0", "--token-file", empty}, "want one token"},
		{[]string{"mcp", "--image", reg.digestRef(), "--listen", "nowhere"}, "want host:port"},
	} {
		if res := flmbox(t, root, tc.args...); res.code != 125 || !strings.Contains(res.stderr, tc.says) {
			t.Errorf("flmbox %v: exit %d, stderr %q; want 125 saying %q", tc.args, res.code, res.stderr, tc.says)
		}
	}
	srv := exec.Command(flmboxBin, "--root", root, "--runsc", runscPath, "mcp", "--image", reg.digestRef(),
		"--listen", "127.0.0.1:0", "--token-file", tokenFile)
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	sc := bufio.NewScanner(stderr)
	var addr string
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "flmbox mcp: serving MCP over HTTP on "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		t.Fatal("flmbox mcp --listen did not say where it serves")
	}
	var rest strings.Builder
	go io.Copy(&rest, stderr)

	stdout := runMCPClient(t, "client_http.mjs", "http://"+addr+"/mcp", "s3cret-token")
	var out struct {
		NoToken                                        string
		Once, InSession, OtherList, OtherRun, OtherEnd mcpResult
		Session                                        string
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("the client printed %q: %v", stdout, err)
	}
	if !strings.Contains(out.NoToken, "a bearer token is needed") {
		t.Errorf("a client without the token: %q, want refused", out.NoToken)
	}
	if resp, err := http.Post("http://"+addr+"/mcp", "application/json", strings.NewReader(`{}`)); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a request without the token: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
	if out.Once.IsError || out.Once.Structured["stdout"] != "42\n" {
		t.Errorf("run_code over HTTP: %+v", out.Once)
	}
	if out.InSession.IsError || out.InSession.Structured["stdout"] != "/tmp\n" || !strings.HasPrefix(out.Session, "mcp-") {
		t.Errorf("run_code in session %q over HTTP: %+v", out.Session, out.InSession)
	}
	if s := toStrings(out.OtherList.Structured["sessions"]); len(s) != 0 || !out.OtherRun.IsError || !out.OtherEnd.IsError {
		t.Errorf("another client saw or reached the first one's session: list %v, run %+v, end %+v", s, out.OtherRun, out.OtherEnd)
	}
	// The ended MCP session's sandbox goes (in the background: poll).
	deadline := time.Now().Add(time.Minute)
	for strings.Contains(mustFlmbox(t, root, "sandbox", "ls"), out.Session) {
		if time.Now().After(deadline) {
			t.Fatalf("session %s outlived its client's MCP session", out.Session)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// DNS rebinding: the loopback address, another host's name.
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	req.Host = "attacker.example:80"
	req.Header.Set("Authorization", "Bearer s3cret-token")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("a request naming another host: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}
	srv.Process.Signal(syscall.SIGTERM)
	if err := srv.Wait(); err != nil {
		t.Errorf("flmbox mcp after SIGTERM: %v\n%s", err, rest.String())
	}
}

// TestMCPSessionIdle: a session no call uses for --session-idle is removed,
// and a call naming it then fails as for any unknown session.
func TestMCPSessionIdle(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	root := sandboxRoot(t, reg)
	stdout := runMCPClient(t, "client_idle.mjs", flmboxBin, "--root", root, "--runsc", runscPath,
		"mcp", "--image", reg.digestRef(), "--session-idle", "2s")
	var out struct {
		Session string
		Gone    bool
		After   mcpResult
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("the client printed %q: %v", stdout, err)
	}
	if !strings.HasPrefix(out.Session, "mcp-") || !out.Gone || !out.After.IsError || !strings.Contains(out.After.text(), "no session") {
		t.Errorf("an idle session: %+v", out)
	}
	if ls := mustFlmbox(t, root, "sandbox", "ls"); strings.Contains(ls, out.Session) {
		t.Errorf("the idle session's sandbox is left:\n%s", ls)
	}
}
