package app

import (
	"testing"

	"github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd"
	"github.com/flmbox/flmbox/sandbox"
)

// TestBatchBoundsAgree: the flmbox command reads batches with runcmd's
// bound, package sandbox runs them with its own.
func TestBatchBoundsAgree(t *testing.T) {
	if runcmd.MaxBatch != sandbox.MaxBatch {
		t.Fatalf("runcmd.MaxBatch %d, sandbox.MaxBatch %d", runcmd.MaxBatch, sandbox.MaxBatch)
	}
}
