package testimage

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

// RefName is the org.opencontainers.image.ref.name annotation of the image
// index in the layout's index.json.
const RefName = "flmbox-test:latest"

// refNameAnnotation is the OCI annotation naming a descriptor of a layout.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// Config of the linux/amd64 image.
var (
	imageEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	imageCmd = []string{"python3"}
)

// inPythonLayer reports whether rel belongs to layer 2: /usr/share and
// /usr/lib/python3*, with everything below them.
func inPythonLayer(rel string) bool {
	if rel == "usr/share" || strings.HasPrefix(rel, "usr/share/") {
		return true
	}
	rest, ok := strings.CutPrefix(rel, "usr/lib/")
	return ok && strings.HasPrefix(rest, "python3")
}

// baseSelection is layer 1: everything but layer 2.
func baseSelection(rel string) (emit, descend bool) {
	if inPythonLayer(rel) {
		return false, false
	}
	return true, true
}

// pythonSelection is layer 2, with entries for its parents usr/ and usr/lib/.
func pythonSelection(rel string) (emit, descend bool) {
	if rel == "usr" || rel == "usr/lib" || inPythonLayer(rel) {
		return true, true
	}
	return false, false
}

// amd64Layers are the layers of the linux/amd64 image made from rootfs.
func amd64Layers(rootfs string) []layerSpec {
	return []layerSpec{
		{name: "base system", fill: func(ctx context.Context, w *layerWriter) error {
			if err := w.writeTree(ctx, rootfs, baseSelection); err != nil {
				return err
			}
			return w.writeFixtures(rootfs, lowerFixtures(), true)
		}},
		{name: "python and /usr/share", fill: func(ctx context.Context, w *layerWriter) error {
			return w.writeTree(ctx, rootfs, pythonSelection)
		}},
		{name: "whiteouts and fixtures", zstd: true, fill: func(_ context.Context, w *layerWriter) error {
			return w.writeFixtures(rootfs, topFixtures(), false)
		}},
	}
}

// placeholderLayer is the one layer of the linux/arm64 image.
func placeholderLayer() layerSpec {
	return layerSpec{name: "arm64 placeholder", fill: func(_ context.Context, w *layerWriter) error {
		return w.writeEntries(placeholderFixtures())
	}}
}

// pack writes the OCI image layout of rootfs to layoutDir and returns the
// image index it holds. Layer files are written to workDir, which the
// caller removes afterwards.
func pack(ctx context.Context, rootfs, workDir, layoutDir string, log logger) (v1.ImageIndex, error) {
	specs := append(amd64Layers(rootfs), placeholderLayer())
	layers := make([]*builtLayer, len(specs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, spec := range specs {
		g.Go(func() error {
			l, err := writeLayer(gctx, workDir, spec)
			layers[i] = l
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, l := range layers {
		log.layer(l)
	}

	amd64, err := platformImage("amd64", layers[:3], imageEnv, imageCmd)
	if err != nil {
		return nil, err
	}
	arm64, err := platformImage("arm64", layers[3:], nil, nil)
	if err != nil {
		return nil, err
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("write image layout %s: %w", layoutDir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: RefName})); err != nil {
		return nil, fmt.Errorf("write image index to layout %s: %w", layoutDir, err)
	}
	// ggcr writes layer blobs 0600 and index blobs 0777&^umask; tests that
	// run as another user read them.
	if err := chmodTree(layoutDir, 0o755, 0o644); err != nil {
		return nil, fmt.Errorf("set modes of layout %s: %w", layoutDir, err)
	}
	return idx, nil
}

// chmodTree sets the mode of every directory and regular file below root.
func chmodTree(root string, dirMode, fileMode fs.FileMode) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			return os.Chmod(p, dirMode)
		case d.Type().IsRegular():
			return os.Chmod(p, fileMode)
		}
		return nil
	})
}

// platformImage assembles an OCI image for linux/arch from built layers.
func platformImage(arch string, layers []*builtLayer, env, cmd []string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: FixtureTime},
		Config:       v1.Config{Env: env, Cmd: cmd},
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("set config of linux/%s image: %w", arch, err)
	}
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{
			Layer:     l.layer,
			MediaType: l.mediaType,
			History:   v1.History{Created: v1.Time{Time: FixtureTime}, CreatedBy: "flmbox testimage: " + l.spec.name},
		}
	}
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("append layers to linux/%s image: %w", arch, err)
	}
	return img, nil
}
