//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/flmbox/flmbox/internal/testrig/testimage"
	"github.com/flmbox/flmbox/runtime"
)

var (
	// flmboxBin is the flmbox command under test, built by TestMain with
	// flmbox-core next to it.
	flmboxBin string
	// flmboxCore is flmbox-core, the whole CLI, next to flmbox.
	flmboxCore string
	// flmboxAgent is flmbox-agent, which every sandbox mounts as its agent.
	flmboxAgent string
	// img is the Python test image.
	img *testimage.Image
	// runscPath is the runsc binary the tests use.
	runscPath string
	// workDir is the suite's own directory, removed when it ends.
	workDir string
)

// Every test has a state root, sandboxes and a registry of its own, and
// runs in parallel with the others (t.Parallel; make test runs
// TEST_PARALLEL at a time). One that must run alone (it bounds a duration,
// races the memory watch, or sets the environment) says why on its first
// line: go test runs such tests before the parallel ones, one at a time.
func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "integration: the integration tests need root: run make test as root")
		os.Exit(1)
	}
	if os.Getenv(privateMountsEnv) == "" {
		os.Exit(inPrivateMounts())
	}
	os.Exit(setup(m))
}

// privateMountsEnv marks the test process that runs in a mount namespace of
// its own (inPrivateMounts).
const privateMountsEnv = "FLMBOX_INTEGRATION_PRIVATE_MOUNTS"

// inPrivateMounts runs the tests in a child in a mount namespace of its own
// (private propagation) and returns its exit code: the test roots' bind
// mounts (copyRoot), and whatever a failed test leaves mounted, go with it
// even when the process dies on a panic or a timeout.
func inPrivateMounts() int {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), privateMountsEnv+"=1")
	// Go makes the new namespace's mounts private before the exec.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	signal.Ignore(os.Interrupt, syscall.SIGTERM) // the child gets them too, and says what it was doing
	goruntime.LockOSThread()                     // Pdeathsig follows the thread that started the child
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() >= 0 {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "integration: run the tests in a mount namespace of their own: %v\n", err)
		return 1
	}
	return 0
}

func setup(m *testing.M) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "integration: "+format+"\n", args...)
		return 1
	}
	var err error
	if runscPath, err = runtime.FindRunsc(os.Getenv(runtime.RunscEnv)); err != nil {
		return fail("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if img, err = testimage.Build(ctx, testimage.Options{Log: os.Stderr}); err != nil {
		return fail("build the test image: %v", err)
	}
	dir, err := os.MkdirTemp("", "flmbox-integration-")
	if err != nil {
		return fail("%v", err)
	}
	defer os.RemoveAll(dir)
	workDir = dir
	// flmbox, flmbox-core, flmbox-bench, flmbox-agent and flmbox-resolver, side by side as installed.
	flmboxBin, flmboxCore, flmboxAgent = filepath.Join(dir, "flmbox"), filepath.Join(dir, "flmbox-core"), filepath.Join(dir, "flmbox-agent")
	build := exec.CommandContext(ctx, "go", "build", "-tags", "urfave_cli_no_docs", "-o", dir+"/", "../cmd/flmbox", "../cmd/flmbox-core", "../cmd/flmbox-bench", "../cmd/flmbox-agent", "../cmd/flmbox-resolver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fail("build flmbox: %v\n%s", err, out)
	}
	code := m.Run()
	if r := sharedRegistry.reg; r != nil {
		r.srv.Close()
	}
	// The tests stream what is large (outputs, copies, images): a test
	// that held one whole shows here.
	hwm, err := maxRSS()
	if err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "integration: the test process's max RSS was %d MiB\n", hwm>>20)
	if hwm > maxTestRSS {
		return fail("the test process's max RSS was %d MiB, over %d MiB", hwm>>20, maxTestRSS>>20)
	}
	if err := checkPrewarmed(); err != nil {
		return fail("%v", err)
	}
	return code
}

// maxTestRSS bounds the test process's max RSS.
const maxTestRSS = 2 << 30

// maxRSS is this process's max RSS so far (VmHWM).
func maxRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

// testRegistry serves the test image from an in-process registry on
// loopback, counting requests and able to tamper with blobs.
type testRegistry struct {
	srv      *httptest.Server
	host     string
	requests atomic.Int64
	blobGets atomic.Int64

	mu      sync.Mutex
	corrupt map[string]bool // blob digest -> serve it with a flipped byte
}

const repo = "flmbox/python"

// sharedRegistry is the registry that the tests share, started by the
// first startRegistry: the test image's blobs are held in memory once.
var sharedRegistry struct {
	once sync.Once
	reg  *testRegistry
	err  error
}

// startRegistry returns the registry the tests share, holding the test
// image's index as flmbox/python:3.12-slim. A test that counts its
// requests, tampers with its blobs or closes it starts one of its own
// (ownRegistry).
func startRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r, err := theSharedRegistry()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// theSharedRegistry starts the registry the tests share on its first call
// and returns it.
func theSharedRegistry() (*testRegistry, error) {
	sharedRegistry.once.Do(func() { sharedRegistry.reg, sharedRegistry.err = newRegistry() })
	return sharedRegistry.reg, sharedRegistry.err
}

// ownRegistry starts a registry of the test's own holding the test image's
// index as flmbox/python:3.12-slim, closed when the test ends.
func ownRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r, err := newRegistry()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.srv.Close)
	return r
}

// newRegistry starts a registry holding the test image's index as
// flmbox/python:3.12-slim; its caller closes r.srv.
func newRegistry() (*testRegistry, error) {
	r := &testRegistry{corrupt: map[string]bool{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			r.blobGets.Add(1)
			d := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
			r.mu.Lock()
			corrupt := r.corrupt[d]
			r.mu.Unlock()
			if corrupt {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				b := rec.Body.Bytes()
				b[len(b)/2] ^= 0xff
				w.WriteHeader(http.StatusOK)
				w.Write(b)
				return
			}
		}
		h.ServeHTTP(w, req)
	}))
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	ref, err := name.ParseReference(r.tagRef())
	if err == nil {
		err = remote.WriteIndex(ref, img.Index)
	}
	if err != nil {
		r.srv.Close()
		return nil, fmt.Errorf("push the test image: %w", err)
	}
	r.requests.Store(0)
	r.blobGets.Store(0)
	return r, nil
}

func (r *testRegistry) tagRef() string { return r.host + "/" + repo + ":3.12-slim" }
func (r *testRegistry) digestRef() string {
	return r.host + "/" + repo + "@" + img.IndexDigest.String()
}
