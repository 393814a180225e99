package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testRegistry is an in-process registry that counts requests and can
// tamper with blobs.
type testRegistry struct {
	*httptest.Server
	requests  atomic.Int64
	blobGets  atomic.Int64
	mu        sync.Mutex
	corrupt   map[string]bool // blob digests served with a flipped byte
	truncated map[string]bool // blob digests served cut in half
}

func newTestRegistry(t *testing.T) *testRegistry {
	t.Helper()
	r := &testRegistry{corrupt: map[string]bool{}, truncated: map[string]bool{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			r.blobGets.Add(1)
			d := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
			r.mu.Lock()
			corrupt, truncated := r.corrupt[d], r.truncated[d]
			r.mu.Unlock()
			if corrupt || truncated {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				b := rec.Body.Bytes()
				if corrupt {
					b[len(b)/2] ^= 0xff
				} else {
					b = b[:len(b)/2]
				}
				w.WriteHeader(http.StatusOK)
				w.Write(b)
				return
			}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *testRegistry) ref(t *testing.T, repo string) string {
	return strings.TrimPrefix(r.URL, "http://") + "/" + repo
}

// tarLayer builds a gzip layer from name -> content ("dir/" names are dirs).
func tarLayer(t *testing.T, files map[string]string, order ...string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range order {
		hdr := &tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}
		if strings.HasSuffix(n, "/") {
			hdr = &tar.Header{Name: n, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(files[n]))
	}
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testImage(t *testing.T, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/usr/bin"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.ConfigMediaType(img, types.OCIConfigJSON)
}

// pushIndex pushes a two-platform index (amd64 and arm64) and returns
// "host/repo@sha256:…" and the amd64 image.
func pushIndex(t *testing.T, r *testRegistry, repo string) (string, v1.Image) {
	t.Helper()
	amd := testImage(t, "amd64",
		tarLayer(t, map[string]string{"etc/": "", "etc/hello": "hello\n", "etc/gone": "x"}, "etc/", "etc/hello", "etc/gone"),
		tarLayer(t, map[string]string{"etc/.wh.gone": "", "usr/": "", "usr/bin/": "", "usr/bin/tool": "#!/bin/sh\n"}, "etc/.wh.gone", "usr/", "usr/bin/", "usr/bin/tool"))
	arm := testImage(t, "arm64", tarLayer(t, map[string]string{"arm.txt": "arm\n"}, "arm.txt"))
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.AppendManifests(idx,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}})
	ref, err := name.ParseReference(r.ref(t, repo) + ":latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	return r.ref(t, repo) + "@" + d.String(), amd
}

func newTestStore(t *testing.T) *Store {
	t.Helper()
	s, err := OpenStore(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var amd64 = Platform{OS: "linux", Architecture: "amd64"}

// assertClean fails if the store holds any entry, staging or trash. OpenStore
// makes every directory it reads, so a missing one is a failure too.
func assertClean(t *testing.T, s *Store) {
	t.Helper()
	for _, d := range []string{"rootfs", "layers", "tmp", "trash"} {
		ents, err := os.ReadDir(filepath.Join(s.dir, d))
		if err != nil {
			t.Errorf("%s/: %v", d, err)
		} else if len(ents) != 0 {
			t.Errorf("%s/ is not empty: %v", d, ents)
		}
	}
	// Empty alias directories may stay; alias files may not.
	err := filepath.WalkDir(filepath.Join(s.dir, "aliases"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			t.Errorf("alias %s is left", p)
		}
		return nil
	})
	if err != nil {
		t.Errorf("aliases/: %v", err)
	}
}

func TestPrewarmByIndexDigestThenOffline(t *testing.T) {
	r := newTestRegistry(t)
	ref, amd := pushIndex(t, r, "py")
	s := newTestStore(t)
	ctx := context.Background()

	res, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	md, _ := amd.Digest()
	if res.Cached || res.ManifestDigest != md.String() || res.Platform != "linux/amd64" || !strings.HasSuffix(ref, res.IndexDigest) {
		t.Fatalf("unexpected result %+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(res.Rootfs, "etc/hello")); err != nil || string(b) != "hello\n" {
		t.Fatalf("etc/hello: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(res.Rootfs, "etc/gone")); !os.IsNotExist(err) {
		t.Fatalf("whited-out etc/gone exists: %v", err)
	}
	if res.SizeBytes != int64(len("hello\n")+len("#!/bin/sh\n")+1) {
		t.Errorf("size %d", res.SizeBytes)
	}

	// A cache hit by index digest makes no request at all.
	before := r.requests.Load()
	r.Close()
	res2, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatalf("cache hit with the registry down: %v", err)
	}
	if !res2.Cached || res2.Rootfs != res.Rootfs || r.requests.Load() != before {
		t.Fatalf("not a clean cache hit: %+v, %d requests", res2, r.requests.Load()-before)
	}
	// The arm64 variant v8 normalises to arm64, but it is not cached.
	if _, err := s.Prewarm(ctx, ref, &PullOptions{Platform: Platform{OS: "linux", Architecture: "arm64"}, Offline: true}); !errors.Is(err, ErrNotCached) || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("offline miss: want not cached, got %v", err)
	}
}

func TestPrewarmPlatforms(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s := newTestStore(t)
	p, _ := ParsePlatform("linux/arm64/v8")
	res, err := s.Prewarm(context.Background(), ref, &PullOptions{Platform: p})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(res.Rootfs, "arm.txt")); err != nil || res.Platform != "linux/arm64" {
		t.Fatalf("arm64 pull: %+v %v", res, err)
	}
	_, err = s.Prewarm(context.Background(), ref, &PullOptions{Platform: Platform{OS: "linux", Architecture: "s390x"}})
	if !errors.Is(err, ErrPlatformNotFound) || !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "linux/amd64, linux/arm64") {
		t.Fatalf("missing platform: %v", err)
	}
}

func TestPrewarmTagAndOffline(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	tag := strings.Split(ref, "@")[0] + ":latest"
	s := newTestStore(t)
	ctx := context.Background()
	if _, err := s.Prewarm(ctx, tag, &PullOptions{Platform: amd64, Offline: true}); !errors.Is(err, ErrNotCached) || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("offline before any resolution: %v", err)
	}
	res, err := s.Prewarm(ctx, tag, &PullOptions{Platform: amd64})
	if err != nil || res.Cached {
		t.Fatalf("%+v %v", res, err)
	}
	// A tag moved: pull policy missing keeps the cached resolution and
	// says so under --debug; always pulls the new one.
	amd := testImage(t, "amd64", tarLayer(t, map[string]string{"moved.txt": "moved\n"}, "moved.txt"))
	tagRef, _ := name.ParseReference(tag)
	if err := remote.Write(tagRef, amd); err != nil {
		t.Fatal(err)
	}
	var debug, warned []string
	logTo := func(to *[]string) func(string, ...any) {
		return func(f string, a ...any) { *to = append(*to, fmt.Sprintf(f, a...)) }
	}
	gets := r.requests.Load()
	kept, err := s.Prewarm(ctx, tag, &PullOptions{Platform: amd64, Debugf: logTo(&debug)})
	if err != nil || !kept.Cached || kept.IndexDigest != res.IndexDigest || r.requests.Load() != gets || len(debug) != 1 {
		t.Fatalf("pull policy missing: %+v %v, %d requests, debug %q; want the cached resolution, no request, a debug line", kept, err, r.requests.Load()-gets, debug)
	}
	moved, err := s.Prewarm(ctx, tag, &PullOptions{Platform: amd64, Policy: PullAlways})
	if md, _ := amd.Digest(); err != nil || moved.Cached || moved.ManifestDigest != md.String() {
		t.Fatalf("pull policy always after the tag moved: %+v %v; want %s", moved, err, md)
	}
	// The registry gone: always falls back to the last resolution, warning.
	r.Close()
	back, err := s.Prewarm(ctx, tag, &PullOptions{Platform: amd64, Policy: PullAlways, Warnf: logTo(&warned)})
	if err != nil || !back.Cached || back.ManifestDigest != moved.ManifestDigest || len(warned) != 1 || !strings.Contains(warned[0], "could not be reached") {
		t.Fatalf("pull policy always, registry gone: %+v %v, warnings %q", back, err, warned)
	}
	for _, o := range []*PullOptions{{Platform: amd64}, {Platform: amd64, Offline: true}, {Platform: amd64, Policy: PullNever}} {
		res2, err := s.Prewarm(ctx, tag, o)
		if err != nil || !res2.Cached || res2.ManifestDigest != moved.ManifestDigest {
			t.Fatalf("%+v with the registry gone: %+v %v", o, res2, err)
		}
	}
	if _, err := ParsePullPolicy("sometimes"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a pull policy of sometimes: %v", err)
	}
}

func TestPrewarmRefusesTamperedContent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(r *testRegistry, layer v1.Hash)
		want   string
	}{
		{"corrupt layer", func(r *testRegistry, l v1.Hash) { r.corrupt[l.String()] = true }, "digest mismatch"},
		{"truncated layer", func(r *testRegistry, l v1.Hash) { r.truncated[l.String()] = true }, "layer 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRegistry(t)
			ref, amd := pushIndex(t, r, "py")
			layers, _ := amd.Layers()
			d, _ := layers[1].Digest()
			tc.tamper(r, d)
			s := newTestStore(t)
			_, err := s.Prewarm(context.Background(), ref, &PullOptions{Platform: amd64})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), d.String()) {
				t.Fatalf("want an error naming layer %s and %q, got %v", d, tc.want, err)
			}
			assertClean(t, s)
		})
	}
}

func TestPrewarmWrongDigestReference(t *testing.T) {
	r := newTestRegistry(t)
	ref, amd := pushIndex(t, r, "py")
	md, _ := amd.Digest()
	// Name the repository's amd64 manifest by the index's digest: the registry
	// serves the index, whose digest is right; now name the index by the
	// manifest's digest under another tag-less reference and expect a match.
	s := newTestStore(t)
	res, err := s.Prewarm(context.Background(), strings.Split(ref, "@")[0]+"@"+md.String(), &PullOptions{Platform: amd64})
	if err != nil || res.IndexDigest != md.String() || res.ManifestDigest != md.String() {
		t.Fatalf("single-manifest digest: %+v %v", res, err)
	}
	// A single-manifest image for another platform is refused.
	_, err = s.Prewarm(context.Background(), strings.Split(ref, "@")[0]+"@"+md.String(), &PullOptions{Platform: Platform{OS: "linux", Architecture: "arm64"}})
	if !errors.Is(err, ErrPlatformNotFound) || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("platform mismatch of a single manifest: %v", err)
	}
}

// pushRaw pushes a manifest document as is, under tag.
func pushRaw(t *testing.T, r *testRegistry, repo, tag string, raw []byte, mt types.MediaType) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v2/%s/manifests/%s", r.URL, repo, tag), bytes.NewReader(raw))
	req.Header.Set("Content-Type", string(mt))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("push manifest: %s", resp.Status)
	}
}

func TestPrewarmRefusesBadManifests(t *testing.T) {
	r := newTestRegistry(t)
	_, amd := pushIndex(t, r, "py")
	good, _ := amd.RawManifest()
	var m map[string]any
	json.Unmarshal(good, &m)
	cfgRaw, _ := amd.RawConfigFile()

	// Both "manifests" and "layers": ambiguous (CVE-2021-41190).
	amb := map[string]any{}
	for k, v := range m {
		amb[k] = v
	}
	amb["manifests"] = []any{}
	ambRaw, _ := json.Marshal(amb)

	// A config whose diff_ids do not match the layers.
	var cfg map[string]any
	json.Unmarshal(cfgRaw, &cfg)
	cfg["rootfs"].(map[string]any)["diff_ids"].([]any)[1] = "sha256:" + strings.Repeat("0", 64)
	badCfg, _ := json.Marshal(cfg)
	cfgLayer := static.NewLayer(badCfg, types.OCIConfigJSON)
	repo, _ := name.NewRepository(strings.TrimPrefix(r.URL, "http://") + "/py")
	if err := remote.WriteLayer(repo, cfgLayer); err != nil {
		t.Fatal(err)
	}
	cd, _ := cfgLayer.Digest()
	wrongDiff := map[string]any{}
	for k, v := range m {
		wrongDiff[k] = v
	}
	wrongDiff["config"] = map[string]any{"mediaType": string(types.OCIConfigJSON), "digest": cd.String(), "size": len(badCfg)}
	wrongDiffRaw, _ := json.Marshal(wrongDiff)

	// A foreign layer.
	foreign := map[string]any{}
	for k, v := range m {
		foreign[k] = v
	}
	ls := append([]any{}, m["layers"].([]any)...)
	l0 := map[string]any{}
	for k, v := range ls[0].(map[string]any) {
		l0[k] = v
	}
	l0["mediaType"] = string(types.DockerForeignLayer)
	ls[0] = l0
	foreign["layers"] = ls
	foreignRaw, _ := json.Marshal(foreign)

	for _, tc := range []struct {
		name string
		raw  []byte
		mt   types.MediaType
		want error
		msg  string
	}{
		{"ambiguous", ambRaw, types.OCIManifestSchema1, errdefs.ErrInvalidArgument, "neither clearly"},
		{"media type contradicts body", good, types.OCIImageIndex, errdefs.ErrInvalidArgument, "served as"},
		{"diff_id mismatch", wrongDiffRaw, types.OCIManifestSchema1, errdefs.ErrFailedPrecondition, "diff_id mismatch"},
		{"foreign layer", foreignRaw, types.OCIManifestSchema1, errdefs.ErrNotImplemented, "foreign"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tag := strings.ReplaceAll(tc.name, " ", "-")
			pushRaw(t, r, "py", tag, tc.raw, tc.mt)
			s := newTestStore(t)
			ref := r.ref(t, "py") + "@" + sha256Hash(tc.raw).String()
			_, err := s.Prewarm(context.Background(), ref, &PullOptions{Platform: amd64})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("want %v mentioning %q, got %v", tc.want, tc.msg, err)
			}
			if tc.name == "diff_id mismatch" && !strings.Contains(err.Error(), "layer 2") {
				t.Errorf("the error must name the layer: %v", err)
			}
			assertClean(t, s)
		})
	}
}

func TestPrewarmConcurrentDownloadsOnce(t *testing.T) {
	r := newTestRegistry(t)
	ref, amd := pushIndex(t, r, "py")
	s := newTestStore(t)
	before := r.blobGets.Load()
	var wg sync.WaitGroup
	results := make([]*Result, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Separate Store values, as separate processes would have.
			st, _ := OpenStore(s.dir)
			results[i], errs[i] = st.Prewarm(context.Background(), ref, &PullOptions{Platform: amd64})
		}()
	}
	wg.Wait()
	fresh := 0
	for i := range 8 {
		if errs[i] != nil {
			t.Fatalf("prewarm %d: %v", i, errs[i])
		}
		if !results[i].Cached {
			fresh++
		}
	}
	layers, _ := amd.Layers()
	// One config and each layer, once.
	if got := r.blobGets.Load() - before; fresh != 1 || got != int64(len(layers)+1) {
		t.Fatalf("%d fresh pulls and %d blob GETs; want 1 and %d", fresh, got, len(layers)+1)
	}
}

func TestRemoveLeaseAndGC(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s := newTestStore(t)
	ctx := context.Background()
	res, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Lease(ctx, res.ManifestDigest, "sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, res.IndexDigest); !errors.Is(err, ErrInUse) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "sb1") {
		t.Fatalf("remove of a leased image: %v", err)
	}
	zero := int64(0)
	var budget *BudgetError
	removed, err := s.GC(ctx, GCOptions{MaxBytes: &zero})
	if !errors.As(err, &budget) || !errors.Is(err, errdefs.ErrUnavailable) || budget.InUse != 1 || budget.Bytes == 0 || len(removed) != 0 {
		t.Fatalf("gc of a cache whose one image is leased, to 0 bytes: removed %v, %v; want nothing, and the budget missed", removed, err)
	}
	if _, err := os.Stat(res.Rootfs); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, res.ManifestDigest, "sb1"); err != nil {
		t.Fatal(err)
	}
	removed, err = s.Remove(ctx, res.IndexDigest)
	if err != nil || len(removed) != 1 || removed[0].ManifestDigest != res.ManifestDigest {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if _, err := os.Stat(res.Rootfs); !os.IsNotExist(err) {
		t.Fatalf("rootfs still there: %v", err)
	}
	// Idempotent.
	if removed, err := s.Remove(ctx, res.IndexDigest); err != nil || len(removed) != 0 {
		t.Fatalf("second remove: %v %v", removed, err)
	}
	assertClean(t, s)
	if err := s.Lease(ctx, res.ManifestDigest, "sb1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("lease of a removed image: %v", err)
	}
	if err := s.Lease(ctx, res.ManifestDigest, "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("lease holder with a path: %v", err)
	}
}

func TestGCRemovesLeftoversAndOldImages(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s := newTestStore(t)
	ctx := context.Background()
	res, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	hex := strings.TrimPrefix(res.ManifestDigest, "sha256:")
	// A killed pull's staging directory and a half-removed entry.
	for _, p := range []string{filepath.Join(s.dir, "tmp", hex+"-123", "rootfs", "etc"), filepath.Join(s.dir, "trash", hex+"-456", "entry")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	leftovers := func(d string) []os.DirEntry {
		t.Helper()
		ents, err := os.ReadDir(filepath.Join(s.dir, d))
		if err != nil {
			t.Fatal(err)
		}
		return ents
	}
	for _, d := range []string{"tmp", "trash"} {
		if ents := leftovers(d); len(ents) != 1 {
			t.Fatalf("%s before gc: %v, want the leftover", d, ents)
		}
	}
	if err := os.WriteFile(filepath.Join(s.dir, "tmp", hex+"-123", "rootfs", "etc", "passwd"), make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	removed, err := s.GC(ctx, GCOptions{})
	if err != nil || len(removed) != 2 {
		t.Fatalf("gc without rules: %v %v, want the two leftovers", removed, err)
	}
	for _, r := range removed {
		if r.ManifestDigest != "" || r.Leftover == "" || r.Leftover == "an interrupted pull" && r.SizeBytes != 1000 {
			t.Errorf("gc without rules removed %+v", r)
		}
	}
	for _, d := range []string{"tmp", "trash"} {
		if ents := leftovers(d); len(ents) != 0 {
			t.Errorf("%s not cleaned: %v", d, ents)
		}
	}
	removed, err = s.GC(ctx, GCOptions{UnusedFor: 1})
	if err != nil || len(removed) != 1 {
		t.Fatalf("gc --unused-for: %v %v", removed, err)
	}
	assertClean(t, s)
}

func TestHTTPGuard(t *testing.T) {
	g := &httpGuard{next: http.DefaultTransport, insecure: []string{"10.1.2.3:5000"}}
	for _, tc := range []struct {
		url     string
		refused bool
	}{
		{"http://10.0.0.1:5000/v2/", true},
		{"http://192.168.1.1/v2/", true},
		{"http://registry.local/v2/", true},
	} {
		req, _ := http.NewRequest(http.MethodGet, tc.url, nil)
		_, err := g.RoundTrip(req)
		var pe *PlainHTTPError
		if tc.refused != errors.Is(err, errdefs.ErrPermissionDenied) || tc.refused != (errors.As(err, &pe) && pe.Host == req.URL.Host) {
			t.Errorf("%s: %v", tc.url, err)
		}
	}
	for _, host := range []string{"127.0.0.1", "localhost", "::1"} {
		if !isLoopback(host) {
			t.Errorf("%s is loopback", host)
		}
	}
}

func TestParseReference(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in, want string
		digest   bool
		bad      bool
	}{
		{in: "python:3.12-slim", want: "index.docker.io/library/python:3.12-slim"},
		{in: "python:3.12-slim@" + d, want: "index.docker.io/library/python@" + d, digest: true},
		{in: "127.0.0.1:5000/py@" + d, want: "127.0.0.1:5000/py@" + d, digest: true},
		{in: "oci-layout:/srv/img@" + d, want: "oci-layout:/srv/img@" + d, digest: true},
		{in: "oci-layout:/srv/img", want: "oci-layout:/srv/img"},
		{in: "oci-layout:/srv/img@sha256:../../etc", bad: true},
		{in: "py@sha256:" + strings.Repeat("AB", 32), bad: true},
		{in: "py@md5:abc", bad: true},
		{in: "UPPER/case", bad: true},
		{in: "oci-layout:", bad: true},
	} {
		r, err := ParseReference(tc.in)
		if tc.bad {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%q: want invalid argument, got %v", tc.in, err)
			}
			continue
		}
		if err != nil || r.String() != tc.want || (r.Digest.Hex != "") != tc.digest {
			t.Errorf("%q: got %q %v %v", tc.in, r.String(), r.Digest, err)
		}
	}
}

func TestParsePlatform(t *testing.T) {
	for in, want := range map[string]string{
		"linux/amd64": "linux/amd64", "linux/x86_64": "linux/amd64", "linux/arm64/v8": "linux/arm64",
		"linux/aarch64": "linux/arm64", "linux/arm": "linux/arm/v7", "Linux/AMD64": "linux/amd64", "linux/armhf": "linux/arm/v7",
	} {
		p, err := ParsePlatform(in)
		if err != nil || p.String() != want {
			t.Errorf("%s: %v %v", in, p, err)
		}
	}
	for _, bad := range []string{"linux", "linux/amd64/v1/x", "linux/../x", "/amd64", "linux/a b"} {
		if _, err := ParsePlatform(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestPrewarmFollowsWrapperIndex(t *testing.T) {
	r := newTestRegistry(t)
	ref, amd := pushIndex(t, r, "py")
	inner, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(inner)
	if err != nil {
		t.Fatal(err)
	}
	// What `crane push --index` of an OCI layout makes: an index whose only
	// entry is the real index, without a platform.
	wrapper := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{Add: idx})
	wref, _ := name.ParseReference(r.ref(t, "wrapped") + ":latest")
	if err := remote.WriteIndex(wref, wrapper); err != nil {
		t.Fatal(err)
	}
	wd, _ := wrapper.Digest()
	res, err := newTestStore(t).Prewarm(context.Background(), r.ref(t, "wrapped")+"@"+wd.String(), &PullOptions{Platform: amd64})
	md, _ := amd.Digest()
	if err != nil || res.ManifestDigest != md.String() || res.IndexDigest != wd.String() {
		t.Fatalf("wrapped index: %+v %v", res, err)
	}
}

func TestDamagedEntryIsRebuiltAndRemovable(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s := newTestStore(t)
	ctx := context.Background()
	res, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	// What a power loss without fsync can leave: an empty image.json.
	meta := filepath.Join(filepath.Dir(res.Rootfs), "image.json")
	if err := os.WriteFile(meta, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := s.Prewarm(ctx, strings.Split(ref, "@")[0]+":latest", &PullOptions{Platform: amd64})
	if err != nil || again.Cached || again.ManifestDigest != res.ManifestDigest {
		t.Fatalf("prewarm over a damaged entry: %+v %v", again, err)
	}
	if err := os.WriteFile(meta, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	removed, err := s.Remove(ctx, res.ManifestDigest)
	if err != nil || len(removed) != 1 {
		t.Fatalf("remove a damaged entry: %v %v", removed, err)
	}
	assertClean(t, s)
}

func TestDeclaredSizeOverTheLimitFetchesNothing(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s := newTestStore(t)
	before := r.blobGets.Load()
	_, err := s.Prewarm(context.Background(), ref, &PullOptions{Platform: amd64, Unpack: UnpackOptions{MaxBytes: 100}})
	var le *LimitError
	if !errors.As(err, &le) || le.What != "compressed bytes" {
		t.Fatalf("want a compressed-size LimitError, got %v", err)
	}
	if n := r.blobGets.Load() - before; n != 0 {
		t.Fatalf("%d blobs fetched for an image over the limit", n)
	}
	assertClean(t, s)
}

func TestPlatformOptionIsNormalized(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	res, err := newTestStore(t).Prewarm(context.Background(), ref, &PullOptions{Platform: Platform{OS: "linux", Architecture: "x86_64"}})
	if err != nil || res.Platform != "linux/amd64" {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestSecondLeaseByTheSameHolderFailsAndKeepsTheFirst(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s := newTestStore(t)
	ctx := context.Background()
	res, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Lease(ctx, res.ManifestDigest, "sb"); err != nil {
		t.Fatal(err)
	}
	if err := s.Lease(ctx, res.ManifestDigest, "sb"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second lease: %v", err)
	}
	if _, err := s.Remove(ctx, res.ManifestDigest); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("the first lease is gone: %v", err)
	}
}

// TestRemoveByID removes an image by the ID `images ls` shows (the start of
// its manifest digest's hex) and fails on an ID that names no image.
func TestRemoveByID(t *testing.T) {
	r := newTestRegistry(t)
	ref, _ := pushIndex(t, r, "py")
	s := newTestStore(t)
	ctx := context.Background()
	res, err := s.Prewarm(ctx, ref, &PullOptions{Platform: amd64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, "0123456789ab"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an ID of no image: %v, want not found", err)
	}
	id := strings.TrimPrefix(res.ManifestDigest, "sha256:")[:12]
	removed, err := s.Remove(ctx, id)
	if err != nil || len(removed) != 1 || removed[0].ManifestDigest != res.ManifestDigest || removed[0].SizeBytes == 0 {
		t.Fatalf("remove by ID %s: %+v %v", id, removed, err)
	}
	assertClean(t, s)
}
