package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestSentinels checks that each sentinel matches itself and its kind, and
// never another sentinel of the same kind.
func TestSentinels(t *testing.T) {
	sentinels := []struct {
		err, kind error
	}{
		{ErrNotCached, errdefs.ErrNotFound},
		{ErrPlatformNotFound, errdefs.ErrNotFound},
		{ErrInUse, errdefs.ErrFailedPrecondition},
	}
	for i, s := range sentinels {
		err := fmt.Errorf("image x: %w", s.err)
		if !errors.Is(err, s.err) || !errors.Is(err, s.kind) {
			t.Errorf("%v: does not match its sentinel and its kind", err)
		}
		if want := "image x: " + s.kind.Error(); err.Error() != want {
			t.Errorf("message %q, want %q", err, want)
		}
		for j, o := range sentinels {
			if i != j && errors.Is(err, o.err) {
				t.Errorf("sentinel %d matches sentinel %d", i, j)
			}
		}
	}
}

// TestErrorsCarryNoAdvice checks the library's errors for the words that
// belong to the CLI (commands and flags to use): they carry kinds instead.
func TestErrorsCarryNoAdvice(t *testing.T) {
	s := newTestStore(t)
	digestRef := "registry.example/py@sha256:" + strings.Repeat("ab", 32)
	_, getDigest := s.Get(digestRef, amd64)
	_, getTag := s.Get("registry.example/py:3", amd64)
	_, offline := s.Prewarm(t.Context(), digestRef, &PullOptions{Platform: amd64, Offline: true})
	for _, tc := range []struct {
		name string
		err  error
		is   []error
	}{
		{"Get of a digest never prewarmed", getDigest, []error{ErrNotCached, errdefs.ErrNotFound}},
		{"Get of a tag never resolved", getTag, []error{ErrNotCached, errdefs.ErrNotFound}},
		{"offline Prewarm of a digest never prewarmed", offline, []error{ErrNotCached, errdefs.ErrNotFound}},
		{"size limit", &LimitError{What: "uncompressed bytes", Limit: 10}, []error{errdefs.ErrResourceExhausted}},
		{"entries limit", &LimitError{What: "entries", Limit: 10}, []error{errdefs.ErrResourceExhausted}},
		{"plain HTTP", &PlainHTTPError{Host: "10.0.0.1:5000"}, []error{errdefs.ErrPermissionDenied}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("no error")
			}
			for _, target := range tc.is {
				if !errors.Is(tc.err, target) {
					t.Errorf("%v does not match %v", tc.err, target)
				}
			}
			if msg := tc.err.Error(); strings.Contains(msg, "flmbox") || strings.Contains(msg, "--") {
				t.Errorf("%q carries CLI advice", msg)
			}
		})
	}
}

// TestMissingLayoutIsNotFound: an OCI layout that is not there, or lacks
// the document a reference names, is errdefs.ErrNotFound.
func TestMissingLayoutIsNotFound(t *testing.T) {
	s := newTestStore(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "index.json"), []byte(`{"schemaVersion":2,"manifests":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("a", 64)
	for _, ref := range []string{
		"oci-layout:" + dir + "/missing",
		"oci-layout:" + dir + "/missing@" + digest,
		"oci-layout:" + dir + "@" + digest, // the layout without that document
	} {
		_, err := s.Prewarm(context.Background(), ref, nil)
		if !errdefs.IsNotFound(err) {
			t.Errorf("prewarm %s: %v, want not found", ref, err)
		}
	}
}
