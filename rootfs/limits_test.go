package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestImplicitDirectoriesCountAsEntries(t *testing.T) {
	e := newUnpackEnv(t)
	deep := strings.Repeat("d/", 100) + "f"
	_, err := e.applyAll(t, &UnpackOptions{MaxEntries: 50}, [][]byte{e.tar(t, []tarEntry{fileEnt(deep, "x", 0o644)})})
	var le *LimitError
	if !errors.As(err, &le) || le.What != "entries" {
		t.Fatalf("one entry 100 directories deep with MaxEntries 50: %v", err)
	}
	e.checkSentinel(t)
}

func TestTooDeepNamesAreRefused(t *testing.T) {
	e := newUnpackEnv(t)
	deep := strings.Repeat("d/", maxDepth) + "f"
	_, err := e.applyAll(t, nil, [][]byte{e.tar(t, []tarEntry{fileEnt(deep, "x", 0o644)})})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "deep") {
		t.Fatalf("a name %d directories deep: %v", maxDepth+1, err)
	}
}

// TestRefusedLayerDoesNotWaitForTheDownload serves a layer whose start is
// not a tar stream and then stalls forever: the pull must fail with the
// refusal, not wait for bytes that never come.
func TestRefusedLayerDoesNotWaitForTheDownload(t *testing.T) {
	junk := bytes.Repeat([]byte("this is not a tar header. "), 4096)
	content := append(junk, make([]byte, 4<<20)...)
	layer := static.NewLayer(content, types.OCIUncompressedLayer)
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, _ = mutate.ConfigFile(img, cf)
	r := newTestRegistry(t)
	ref, _ := name.ParseReference(r.ref(t, "junk") + ":latest")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	ld, _ := layer.Digest()
	md, _ := img.Digest()
	// Serve the layer's first 2 MiB (more than the unpacker reads ahead in one
	// go), then stall until the client goes away.
	stalling := r.Config.Handler
	r.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, ld.String()) {
			w.Header().Set("Content-Length", fmt.Sprint(len(content)))
			w.WriteHeader(http.StatusOK)
			w.Write(content[:2<<20])
			w.(http.Flusher).Flush()
			<-req.Context().Done()
			return
		}
		stalling.ServeHTTP(w, req)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newTestStore(t)
	_, err = s.Prewarm(ctx, r.ref(t, "junk")+"@"+md.String(), &PullOptions{Platform: amd64})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "not a tar stream") {
		t.Fatalf("want the refusal of the layer, got %v", err)
	}
	assertClean(t, s)
}
