package mcpserver

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/flmbox/flmbox/sandbox"
)

// Bounds of what the file tools move.
const (
	// MaxFileBytes bounds a file written or read by a tool.
	MaxFileBytes = 10 << 20
	// MaxImages and MaxImageBytes bound the images of a call: the first
	// MaxImages by name, each at most MaxImageBytes.
	MaxImages     = 4
	MaxImageBytes = 2 << 20
	// MaxListed bounds the entries list_files returns.
	MaxListed = 1000
)

// imageTypes are the images a call's images_dir gives back, by extension.
var imageTypes = map[string]string{".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".svg": "image/svg+xml"}

func (c *Conn) addFileTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: fmt.Sprintf("Write a file under /tmp of a session "+
		"(text, or base64 with encoding base64; at most %d MiB). Its directory must exist.", MaxFileBytes>>20)}, c.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: fmt.Sprintf("Read a file of a session (at most %d MiB): "+
		"text if it is UTF-8, else base64; an image also comes back as an image.", MaxFileBytes>>20)}, c.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "list_files", Description: fmt.Sprintf("List a directory of a session (default /tmp; "+
		"at most %d entries): each entry's name, type and size.", MaxListed)}, c.listFiles)
}

// WriteFileIn is write_file's input.
type WriteFileIn struct {
	Session  string `json:"session" jsonschema:"the session, as create_session returned it"`
	Path     string `json:"path" jsonschema:"an absolute path under /tmp"`
	Content  string `json:"content" jsonschema:"the file's content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (the default) or base64"`
}

// FileOut says what a file tool did.
type FileOut struct {
	Path     string `json:"path"`
	Bytes    int64  `json:"bytes"`
	Content  string `json:"content,omitempty"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text or base64"`
}

func (c *Conn) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileIn) (*mcp.CallToolResult, FileOut, error) {
	sb, done, ok := c.session(in.Session)
	if !ok {
		return nil, FileOut{}, fmt.Errorf("no session %q: create_session makes one", in.Session)
	}
	defer done()
	if err := underTmp(in.Path); err != nil {
		return nil, FileOut{}, fmt.Errorf("path: %w", err)
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "text":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, FileOut{}, fmt.Errorf("content is not base64: %v", err)
		}
	default:
		return nil, FileOut{}, fmt.Errorf("encoding %q: use text or base64", in.Encoding)
	}
	if len(data) > MaxFileBytes {
		return nil, FileOut{}, fmt.Errorf("%d bytes: at most %d MiB", len(data), MaxFileBytes>>20)
	}
	p := path.Clean(in.Path)
	tr := tarOf(&tar.Header{Typeflag: tar.TypeReg, Name: path.Base(p), Mode: 0o644, Size: int64(len(data)), ModTime: time.Now()}, data)
	if err := sb.CopyIn(ctx, p, tr, sandbox.CopyOptions{MaxBytes: MaxFileBytes}); err != nil {
		return nil, FileOut{}, oneLine(err)
	}
	return nil, FileOut{Path: p, Bytes: int64(len(data))}, nil
}

// PathIn names a path of a session.
type PathIn struct {
	Session string `json:"session" jsonschema:"the session, as create_session returned it"`
	Path    string `json:"path,omitempty" jsonschema:"an absolute path (list_files: default /tmp)"`
}

func (c *Conn) readFile(ctx context.Context, _ *mcp.CallToolRequest, in PathIn) (*mcp.CallToolResult, FileOut, error) {
	sb, done, ok := c.session(in.Session)
	if !ok {
		return nil, FileOut{}, fmt.Errorf("no session %q: create_session makes one", in.Session)
	}
	defer done()
	if !path.IsAbs(in.Path) {
		return nil, FileOut{}, fmt.Errorf("path %q: use an absolute path", in.Path)
	}
	p := path.Clean(in.Path)
	data, err := readOne(ctx, sb, p, MaxFileBytes)
	if err != nil {
		return nil, FileOut{}, oneLine(err)
	}
	out := FileOut{Path: p, Bytes: int64(len(data)), Content: string(data), Encoding: "text"}
	if !utf8.Valid(data) {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	}
	var res *mcp.CallToolResult
	if mime, ok := imageTypes[strings.ToLower(path.Ext(p))]; ok && len(data) <= MaxImageBytes {
		res = &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%s: %d bytes", p, len(data))},
			&mcp.ImageContent{Data: data, MIMEType: mime}}}
	}
	return res, out, nil
}

// readOne reads the regular file p of sb, at most limit bytes.
func readOne(ctx context.Context, sb *sandbox.Sandbox, p string, limit int64) ([]byte, error) {
	rc, err := sb.CopyOut(ctx, p, sandbox.CopyOptions{MaxBytes: limit})
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdr, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil, fmt.Errorf("%s is not a regular file: %w", p, errdefs.ErrInvalidArgument)
	}
	return io.ReadAll(io.LimitReader(tr, limit))
}

// Entry is a directory entry list_files returns.
type Entry struct {
	Name  string `json:"name"`
	Type  string `json:"type" jsonschema:"file, dir, link or other"`
	Bytes int64  `json:"bytes"`
}

// ListOut is list_files's result.
type ListOut struct {
	Path      string  `json:"path"`
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated,omitempty"`
}

func (c *Conn) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in PathIn) (*mcp.CallToolResult, ListOut, error) {
	sb, done, ok := c.session(in.Session)
	if !ok {
		return nil, ListOut{}, fmt.Errorf("no session %q: create_session makes one", in.Session)
	}
	defer done()
	p := "/tmp"
	if in.Path != "" {
		if !path.IsAbs(in.Path) {
			return nil, ListOut{}, fmt.Errorf("path %q: use an absolute path", in.Path)
		}
		p = path.Clean(in.Path)
	}
	// A scan by the sandbox's Python, as its user: a copy out of the
	// directory would carry every file's content, its subdirectories' too.
	dir, _ := json.Marshal(p) // a JSON string is a Python string literal
	res, err := sb.Call(ctx, sandbox.Request{Language: "python", Timeout: time.Minute, Code: fmt.Sprintf(listCode, dir, MaxListed)})
	if err != nil {
		return nil, ListOut{}, oneLine(err)
	}
	if res.ExitCode != 0 {
		return nil, ListOut{}, fmt.Errorf("list %s: %s", p, lastLine(string(res.Stderr.Data)))
	}
	var rows [][3]any
	if err := json.Unmarshal(res.Stdout.Data, &rows); err != nil {
		return nil, ListOut{}, fmt.Errorf("list %s: %w", p, err)
	}
	out := ListOut{Path: p, Entries: []Entry{}, Truncated: len(rows) > MaxListed}
	for _, r := range rows[:min(len(rows), MaxListed)] {
		name, _ := r[0].(string)
		typ, _ := r[1].(string)
		size, _ := r[2].(float64)
		out.Entries = append(out.Entries, Entry{Name: name, Type: typ, Bytes: int64(size)})
	}
	return nil, out, nil
}

// listCode lists directory %s (a Python string literal), at most %d
// entries and one more to say there are more, as JSON rows [name, type,
// bytes], never following a link.
const listCode = `import json, os, stat
out = []
with os.scandir(%s) as it:
    for e in it:
        st = e.stat(follow_symlinks=False)
        m = st.st_mode
        t = 'dir' if stat.S_ISDIR(m) else 'file' if stat.S_ISREG(m) else 'link' if stat.S_ISLNK(m) else 'other'
        out.append([e.name, t, st.st_size])
        if len(out) > %d:
            break
print(json.dumps(out))
`

// lastLine is s's last non-empty line.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// walkDir calls fn with the header of each entry directly in directory p
// of sb (not its subdirectories' entries), until fn returns false.
func walkDir(ctx context.Context, sb *sandbox.Sandbox, p string, fn func(*tar.Header) bool) error {
	rc, err := sb.CopyOut(ctx, p, sandbox.CopyOptions{MaxBytes: sandbox.MaxCopyBytes})
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	top, err := tr.Next()
	if err != nil {
		return fmt.Errorf("list %s: %w", p, err)
	}
	if top.Typeflag != tar.TypeDir {
		return fmt.Errorf("%s is not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	prefix := strings.TrimSuffix(top.Name, "/") + "/"
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", p, err)
		}
		rest, ok := strings.CutPrefix(strings.TrimSuffix(hdr.Name, "/"), prefix)
		if !ok || strings.Contains(rest, "/") || rest == "" {
			continue
		}
		if !fn(hdr) {
			return nil
		}
	}
}

// readImages returns the images of dir in sb written since start (by
// extension; the first MaxImages by name, each at most MaxImageBytes), and
// a note of those left out.
func readImages(ctx context.Context, sb *sandbox.Sandbox, dir string, start time.Time) ([]mcp.Content, string) {
	var names []string
	err := walkDir(ctx, sb, dir, func(hdr *tar.Header) bool {
		if _, ok := imageTypes[strings.ToLower(path.Ext(hdr.Name))]; ok && hdr.Typeflag == tar.TypeReg && !hdr.ModTime.Before(start.Add(-time.Second)) {
			names = append(names, path.Base(hdr.Name))
		}
		return true
	})
	if err != nil {
		return nil, fmt.Sprintf("[images of %s: %v]", dir, oneLine(err))
	}
	slices.Sort(names)
	var out []mcp.Content
	var left []string
	for _, n := range names {
		if len(out) == MaxImages {
			left = append(left, n)
			continue
		}
		data, err := readOne(ctx, sb, path.Join(dir, n), MaxImageBytes+1)
		if err != nil || len(data) > MaxImageBytes {
			left = append(left, n)
			continue
		}
		out = append(out, &mcp.ImageContent{Data: data, MIMEType: imageTypes[strings.ToLower(path.Ext(n))]})
	}
	if len(left) > 0 {
		return out, fmt.Sprintf("[images of %s left out (more than %d, larger than %d MiB or unreadable): %s]", dir, MaxImages, MaxImageBytes>>20, strings.Join(left, ", "))
	}
	return out, ""
}

// ensureDir makes directory dir of sb if it is missing (its parent must
// exist).
func ensureDir(ctx context.Context, sb *sandbox.Sandbox, dir string) error {
	rc, err := sb.CopyOut(ctx, dir, sandbox.CopyOptions{MaxBytes: 1})
	if err == nil {
		_, err = tar.NewReader(rc).Next() // a missing dir fails the stream's first read
		rc.Close()
	}
	switch {
	case err == nil, errdefs.IsOutOfRange(err):
		return nil // it is there (with files in it)
	case !errdefs.IsNotFound(err):
		return err
	}
	d := path.Clean(dir)
	return sb.CopyIn(ctx, path.Dir(d)+"/", tarOf(&tar.Header{Typeflag: tar.TypeDir, Name: path.Base(d) + "/", Mode: 0o755, ModTime: time.Now()}, nil), sandbox.CopyOptions{})
}

// underTmp checks that p is an absolute path below /tmp.
func underTmp(p string) error {
	if !path.IsAbs(p) || !strings.HasPrefix(path.Clean(p)+"/", "/tmp/") || path.Clean(p) == "/tmp" {
		return fmt.Errorf("%q: use an absolute path below /tmp, the only writable directory", p)
	}
	return nil
}

// tarOf is a tar stream of one entry.
func tarOf(hdr *tar.Header, data []byte) io.Reader {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(hdr)
	tw.Write(data)
	tw.Close()
	return &b
}
