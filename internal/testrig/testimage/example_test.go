package testimage_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/flmbox/flmbox/internal/testrig/testimage"
)

// Serve the test image from an in-process registry, as integration tests
// do. The first Build on a machine needs root and takes about a minute.
func ExampleBuild() {
	ctx := context.Background()
	img, err := testimage.Build(ctx, testimage.Options{Log: os.Stderr})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/flmbox-test:latest")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := remote.WriteIndex(ref, img.Index, remote.WithContext(ctx)); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("pull %s@%s (linux/amd64 is %s)\n", ref.Context(), img.IndexDigest, img.AMD64Digest)
}
