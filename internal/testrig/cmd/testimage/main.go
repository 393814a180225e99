// Command testimage builds, or finds in its cache, the Python test image of
// package testimage and prints where its OCI image layout is.
//
// Usage:
//
//	testimage [-cache DIR] [-testsuite] [-datascience] [-json]
//
// -testsuite and -datascience select the variants of the conformance suite
// (testimage.Options).
// The first run on a machine needs root and the Debian mirror and takes
// about a minute (debootstrap); later runs print the cached layout at once.
// Progress goes to stderr. Without -json the output is two lines,
// "layout PATH" and "index_digest DIGEST"; with -json it is one object with
// the keys layout, index_digest, amd64_digest and arm64_digest.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/flmbox/flmbox/internal/testrig/testimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "testimage: %v\n", err)
		os.Exit(1)
	}
}

// output is what -json prints.
type output struct {
	Layout      string `json:"layout"`
	IndexDigest string `json:"index_digest"`
	AMD64Digest string `json:"amd64_digest"`
	ARM64Digest string `json:"arm64_digest"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("testimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cache := fs.String("cache", "", "cache directory (default $"+testimage.CacheDirEnv+", else "+testimage.DefaultCacheDir+")")
	asJSON := fs.Bool("json", false, "print a JSON object with the layout path and the digests")
	testsuite := fs.Bool("testsuite", false, "the variant with CPython's regression tests")
	dataScience := fs.Bool("datascience", false, "the variant with numpy, pandas, scipy, scikit-learn, matplotlib and pytest")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q; usage: testimage [-cache DIR] [-testsuite] [-datascience] [-json]", fs.Args())
	}
	img, err := testimage.Build(ctx, testimage.Options{CacheDir: *cache, Log: stderr, Testsuite: *testsuite, DataScience: *dataScience})
	if err != nil {
		return err
	}
	if !*asJSON {
		_, err = fmt.Fprintf(stdout, "layout %s\nindex_digest %s\n", img.LayoutPath, img.IndexDigest)
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(output{
		Layout:      img.LayoutPath,
		IndexDigest: img.IndexDigest.String(),
		AMD64Digest: img.AMD64Digest.String(),
		ARM64Digest: img.ARM64Digest.String(),
	})
}
