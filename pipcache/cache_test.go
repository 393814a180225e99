package pipcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flmbox/flmbox/pipcache/wheeltest"
)

// writeWheel writes a wheel of name and version under its filename in dir
// (or as file, if given) and returns the path.
func writeWheel(t *testing.T, dir, name, version, file string, files map[string]string) string {
	t.Helper()
	if file == "" {
		file = wheeltest.Filename(name, version)
	}
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, wheeltest.Build(name, version, files), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func openCache(t *testing.T) *Cache {
	t.Helper()
	c, err := Open(filepath.Join(t.TempDir(), "pipcache"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// contents lists the names under the cache's wheels/, blobs/ and tmp/.
func contents(t *testing.T, c *Cache) (wheels, blobs, tmp []string) {
	t.Helper()
	for _, d := range []struct {
		dir string
		out *[]string
	}{{c.WheelsDir(), &wheels}, {c.blobsDir(), &blobs}, {c.tmpDir(), &tmp}} {
		ents, err := os.ReadDir(d.dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			*d.out = append(*d.out, e.Name())
		}
	}
	return
}

func TestAddListRemove(t *testing.T) {
	ctx := context.Background()
	c := openCache(t)
	src := t.TempDir()
	p := writeWheel(t, src, "hello", "1.0", "", helloFiles)
	added, err := c.Add(ctx, []string{p})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if len(added) != 1 || added[0].Digest != digest || added[0].Name != "hello" || added[0].Version != "1.0" || added[0].AlreadyCached {
		t.Fatalf("Add returned %+v", added[0])
	}
	// What sandboxes read: a flat directory, readable by anyone, of the
	// same bytes.
	fi, err := os.Stat(filepath.Join(c.WheelsDir(), "hello-1.0-py3-none-any.whl"))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("the cached wheel: %v %v", fi, err)
	}
	if di, _ := os.Stat(c.WheelsDir()); di.Mode().Perm() != 0o755 {
		t.Fatalf("wheels/ is %v", di.Mode())
	}
	if got, _ := os.ReadFile(filepath.Join(c.WheelsDir(), "hello-1.0-py3-none-any.whl")); string(got) != string(b) {
		t.Fatal("the cached wheel differs from the file added")
	}
	// Adding the same content again changes nothing.
	again, err := c.Add(ctx, []string{p})
	if err != nil || !again[0].AlreadyCached {
		t.Fatalf("second Add: %+v, %v", again, err)
	}
	// More versions, and the same bytes under a second set of tags.
	p2 := writeWheel(t, src, "hello", "2.0", "", helloFiles)
	dup := filepath.Join(src, "hello-1.0-py2.py3-none-any.whl")
	os.WriteFile(dup, b, 0o600)
	other := writeWheel(t, src, "Other.Project", "0.1", "", nil)
	if _, err := c.Add(ctx, []string{p2, dup, other}); err != nil {
		t.Fatal(err)
	}
	ws, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range ws {
		got = append(got, w.Name+" "+w.Version+" "+w.Filename)
		if !strings.HasPrefix(w.Digest, "sha256:") || w.Size == 0 || w.Added.IsZero() {
			t.Errorf("listed %+v", w)
		}
	}
	want := "hello 1.0 hello-1.0-py2.py3-none-any.whl|hello 1.0 hello-1.0-py3-none-any.whl|hello 2.0 hello-2.0-py3-none-any.whl|other-project 0.1 Other_Project-0.1-py3-none-any.whl"
	if strings.Join(got, "|") != want {
		t.Fatalf("List:\n%s\nwant\n%s", strings.Join(got, "|"), want)
	}
	if ws[0].Digest != ws[1].Digest {
		t.Fatal("the same bytes have two digests")
	}
	if _, blobs, _ := contents(t, c); len(blobs) != 3 {
		t.Fatalf("blobs: %v", blobs)
	}

	sel := func(s string) Selector {
		x, err := ParseSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	removed, err := c.Remove(ctx, []Selector{sel("HELLO==1.0.0")})
	if err != nil || len(removed) != 2 {
		t.Fatalf("Remove hello==1.0: %v, %v", removed, err)
	}
	removed, err = c.Remove(ctx, []Selector{sel("nothing")})
	if err != nil || len(removed) != 0 {
		t.Fatalf("Remove of nothing: %v, %v", removed, err)
	}
	removed, err = c.Remove(ctx, []Selector{sel("hello"), sel("other_project")})
	if err != nil || len(removed) != 2 {
		t.Fatalf("Remove hello other_project: %v, %v", removed, err)
	}
	if wheels, blobs, tmp := contents(t, c); len(wheels)+len(blobs)+len(tmp) != 0 {
		t.Fatalf("left after removing everything: %v %v %v", wheels, blobs, tmp)
	}
}

// TestAddIsAllOrNothing adds a batch with one bad file: nothing of the
// batch may be imported, and nothing may be left behind.
func TestAddIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	good := writeWheel(t, src, "hello", "1.0", "", helloFiles)
	for name, bad := range map[string]func() string{
		"not a zip": func() string {
			p := filepath.Join(src, "broken-1.0-py3-none-any.whl")
			os.WriteFile(p, []byte("PK\x03\x04 not really"), 0o600)
			return p
		},
		"mismatch":  func() string { return writeWheel(t, src, "evil", "1.0", "named-1.0-py3-none-any.whl", nil) },
		"bad name":  func() string { return writeWheel(t, src, "x", "1.0", "x.zip", nil) },
		"directory": func() string { p := filepath.Join(src, "d-1.0-py3-none-any.whl"); os.Mkdir(p, 0o700); return p },
		"fifo": func() string {
			p := filepath.Join(src, "f-1.0-py3-none-any.whl")
			syscall.Mkfifo(p, 0o600)
			return p
		},
		"missing": func() string { return filepath.Join(src, "gone-1.0-py3-none-any.whl") },
	} {
		t.Run(name, func(t *testing.T) {
			c := openCache(t)
			_, err := c.Add(ctx, []string{good, bad()})
			if err == nil || !strings.Contains(err.Error(), "nothing was imported") {
				t.Fatalf("got %v", err)
			}
			if wheels, blobs, tmp := contents(t, c); len(wheels)+len(blobs)+len(tmp) != 0 {
				t.Fatalf("left behind: %v %v %v", wheels, blobs, tmp)
			}
		})
	}
}

func TestAddRefusesOtherContentUnderAFilename(t *testing.T) {
	ctx := context.Background()
	c := openCache(t)
	a := writeWheel(t, t.TempDir(), "hello", "1.0", "", helloFiles)
	b := writeWheel(t, t.TempDir(), "hello", "1.0", "", map[string]string{"hello/__init__.py": "EVIL = 1\n"})
	if _, err := c.Add(ctx, []string{a, b}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "two different files") {
		t.Fatalf("one batch: %v", err)
	}
	if _, err := c.Add(ctx, []string{a}); err != nil {
		t.Fatal(err)
	}
	cached := filepath.Join(c.WheelsDir(), filepath.Base(a))
	before, err := os.ReadFile(cached)
	if err != nil || len(before) == 0 {
		t.Fatalf("the cached wheel before the conflict: %d bytes, %v", len(before), err)
	}
	other := writeWheel(t, t.TempDir(), "other", "1.0", "", nil)
	_, err = c.Add(ctx, []string{other, b})
	var ce *ConflictError
	if !errors.Is(err, errdefs.ErrAlreadyExists) || !errors.As(err, &ce) || ce.Name != "hello" || ce.Version != "1.0" ||
		ce.Filename != filepath.Base(b) || !strings.Contains(err.Error(), filepath.Base(b)) {
		t.Fatalf("got %v", err)
	}
	after, err := os.ReadFile(cached)
	if err != nil {
		t.Fatalf("the cached wheel after the conflict: %v", err)
	}
	if string(before) != string(after) {
		t.Fatal("the cached wheel was replaced")
	}
	if ws, _ := c.List(ctx); len(ws) != 1 {
		t.Fatalf("the batch was half imported: %v", ws)
	}
}

func TestAddSweepsLeftovers(t *testing.T) {
	ctx := context.Background()
	c := openCache(t)
	old := time.Now().Add(-time.Hour)
	// A killed import's staging file, a killed import's blob that was never
	// linked, and a live import's fresh staging file.
	stale := filepath.Join(c.tmpDir(), "add-1.whl")
	if err := os.WriteFile(stale, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	orphan := c.blobPath(strings.Repeat("ab", 32))
	if err := os.WriteFile(orphan, []byte("unlinked"), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(c.tmpDir(), "add-2.whl")
	if err := os.WriteFile(fresh, []byte("being written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Add(ctx, []string{writeWheel(t, t.TempDir(), "hello", "1.0", "", helloFiles)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Error("the stale staging file was kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Error("a fresh staging file was removed")
	}
	// Orphan blobs go with the next removal (even of nothing).
	if _, err := c.Remove(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Error("the orphan blob was kept")
	}
	if ws, _ := c.List(ctx); len(ws) != 1 || ws[0].Digest == "" {
		t.Fatalf("List: %v", ws)
	}
}

func TestAddCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := openCache(t)
	if _, err := c.Add(ctx, []string{writeWheel(t, t.TempDir(), "hello", "1.0", "", helloFiles)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if wheels, blobs, tmp := contents(t, c); len(wheels)+len(blobs)+len(tmp) != 0 {
		t.Fatalf("left behind: %v %v %v", wheels, blobs, tmp)
	}
}

func TestSandboxEnv(t *testing.T) {
	if got := strings.Join(SandboxEnv("/w", false), " "); !strings.Contains(got, "PIP_FIND_LINKS=/w") || !strings.Contains(got, "PIP_NO_INDEX=1") {
		t.Errorf("offline: %s", got)
	}
	if got := strings.Join(SandboxEnv("/w", true), " "); strings.Contains(got, "PIP_NO_INDEX") {
		t.Errorf("online: %s", got)
	}
}
