package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestFindRunscErrors(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "runsc-not-executable")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, pathEnv string
		is                  []error
		isNot               error
	}{
		{"a missing file", filepath.Join(dir, "missing"), "", []error{ErrRunscNotFound, errdefs.ErrNotFound, os.ErrNotExist}, ErrRunscNotExecutable},
		{"a directory", dir, "", []error{ErrRunscNotExecutable, errdefs.ErrInvalidArgument}, ErrRunscNotFound},
		{"a file without execute permission", plain, "", []error{ErrRunscNotExecutable, errdefs.ErrInvalidArgument}, ErrRunscNotFound},
		{"none on PATH", "", dir, []error{ErrRunscNotFound, errdefs.ErrNotFound}, ErrRunscNotExecutable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pathEnv != "" {
				t.Setenv("PATH", tc.pathEnv)
			}
			_, err := FindRunsc(tc.path)
			for _, target := range tc.is {
				if !errors.Is(err, target) {
					t.Errorf("%v does not match %v", err, target)
				}
			}
			if errors.Is(err, tc.isNot) {
				t.Errorf("%v matches the other sentinel", err)
			}
			// What to do next is the CLI's to say (cmd/flmbox/app/hints.go).
			if msg := err.Error(); strings.Contains(msg, "make") || strings.Contains(msg, "--runsc") || strings.Contains(msg, RunscEnv) {
				t.Errorf("%q carries CLI advice", msg)
			}
		})
	}
}
