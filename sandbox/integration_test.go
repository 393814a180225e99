//go:build integration

package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flmbox/flmbox/internal/mountinfo"
	"github.com/flmbox/flmbox/internal/testrig/testimage"
	"github.com/flmbox/flmbox/runtime"
	"github.com/flmbox/flmbox/sandbox"
)

func init() { withRunsc = setupExamples }

// setupExamples points the examples at a new state root, runsc, an agent
// built from this tree and the test image, or says what is missing.
func setupExamples() (func(), error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the examples run sandboxes: run them as root")
	}
	runsc, err := runtime.FindRunsc(os.Getenv(runtime.RunscEnv))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	img, err := testimage.Build(ctx, testimage.Options{Log: os.Stderr})
	if err != nil {
		return nil, fmt.Errorf("build the test image: %w", err)
	}
	dir, err := os.MkdirTemp("", "flmbox-examples-")
	if err != nil {
		return nil, err
	}
	cleanup := func() {
		mounts, _ := mountinfo.Under(dir)
		for _, m := range mounts {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		os.RemoveAll(dir)
	}
	agent := filepath.Join(dir, sandbox.AgentName)
	build := exec.CommandContext(ctx, "go", "build", "-o", agent, "../cmd/flmbox-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		cleanup()
		return nil, fmt.Errorf("build the agent: %w\n%s", err, out)
	}
	root = filepath.Join(dir, "root")
	image = "oci-layout:" + img.LayoutPath + "@" + img.IndexDigest.String()
	options = []sandbox.Option{sandbox.WithRunsc(runsc), sandbox.WithAgent(agent)}
	return cleanup, nil
}
