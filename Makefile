# flmbox: two commands on a fresh Debian machine, as root:
#   make demo   installs what it needs, builds, and runs the main job
#   make test   installs what it needs and runs every test (unit, fuzz smoke, integration)

SHELL := /bin/bash
GO ?= go
export CGO_ENABLED := 0
export PATH := /usr/local/go/bin:$(PATH)

RUNSC_VERSION := v0.0.0-20260905035102-160fafc42237
RUNSC_BIN     := /usr/local/bin/runsc
FLMBOX        := bin/flmbox
FLMBOX_ROOT   ?= /var/lib/flmbox
FUZZTIME      ?= 3000x
# urfave/cli without its man-page and markdown generators (0.4 ms of every start)
GOTAGS        := urfave_cli_no_docs
# A hash of the source, stamped into every binary: flmbox checks that the
# flmbox-core it hands a command line to is of its own build, and flmbox-core
# the flmbox-bench it hands flmbox bench to.
STAMP         := $(shell find . -path ./bin -prune -o \( -name '*.go' -o -name go.mod -o -name go.sum \) -type f -print | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)
LDFLAGS       := -X github.com/flmbox/flmbox/cmd/flmbox/internal/runcmd.Build=$(STAMP)

.PHONY: all build deps runsc testimage demo test unit integration conformance fuzz bench vet clean proto mcpclient

all: build

build:
	$(GO) build -tags $(GOTAGS) -ldflags '$(LDFLAGS)' -o bin/ ./cmd/flmbox ./cmd/flmbox-core ./cmd/flmbox-bench ./cmd/flmbox-agent ./cmd/flmbox-resolver

# System packages: debootstrap builds the test image.
deps:
	@command -v $(GO) >/dev/null || { echo "Go is missing: install Go 1.26 into /usr/local/go" >&2; exit 1; }
	@command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; }

# gVisor's runsc, pinned, built without cgo (a cgo build fails at create).
# Falls back to Debian's runsc package if the build fails.
runsc:
	@if [ -x $(RUNSC_BIN) ] && $(GO) version -m $(RUNSC_BIN) 2>/dev/null | grep -q '$(RUNSC_VERSION)'; then \
		echo "runsc $(RUNSC_VERSION) is installed at $(RUNSC_BIN)"; \
	elif GOBIN=/usr/local/bin $(GO) install gvisor.dev/gvisor/runsc@$(RUNSC_VERSION); then \
		echo "built runsc $(RUNSC_VERSION) into $(RUNSC_BIN)"; \
	else \
		echo "building runsc failed; installing Debian's runsc package" >&2; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc; \
	fi

# The Python test image (debootstrap, cached under /var/cache/flmbox/testimage).
testimage: deps
	@mkdir -p bin
	$(GO) run ./internal/testrig/cmd/testimage -json > bin/testimage.json.tmp && mv bin/testimage.json.tmp bin/testimage.json
	@cat bin/testimage.json

demo: deps runsc build testimage
	@layout=$$(sed -n 's/.*"layout": *"\([^"]*\)".*/\1/p' bin/testimage.json); \
	index=$$(sed -n 's/.*"index_digest": *"\([^"]*\)".*/\1/p' bin/testimage.json); \
	image=oci-layout:$$layout@$$index; \
	f="$(FLMBOX) --root $(FLMBOX_ROOT)"; \
	set -ex; \
	$$f doctor; \
	$$f prewarm $$image; \
	$$f prewarm --json $$image; \
	$$f images ls; \
	: "Demo 1: three calls in one persistent sandbox; files in /tmp persist"; \
	$$f sandbox rm demo; \
	$$f sandbox create --name demo --image $$image; \
	$$f run --sandbox demo --language shell -c 'mkdir -p /tmp/demo && printf "region,revenue,cost\neast,120,75\nwest,80,55\neast,150,90\nwest,100,70\n" > /tmp/demo/sales.csv'; \
	$$f run --sandbox demo demo/demo1.py; \
	: "... suspended to disk between two calls (no process left), resumed by the third, and its result copied out"; \
	$$f sandbox suspend demo; \
	$$f sandbox ls; \
	$$f run --sandbox demo --language shell -c 'cat /tmp/demo/summary.json; echo'; \
	d=$$(mktemp -d); $$f cp demo:/tmp/demo/summary.json $$d/; cat $$d/summary.json; echo; rm -rf $$d; \
	$$f sandbox ls; \
	$$f sandbox rm demo; \
	: "A warm pool: run --image takes a clean running sandbox and gives it back reset"; \
	$$f pool fill $$image --size 1; \
	$$f run --image $$image -c 'import os; print("pid", os.getpid(), "tmp", os.listdir("/tmp"))'; \
	$$f pool ls; \
	$$f pool drain; \
	: "Demo 2: a batch of four snippets, each in a clean sandbox; results in input order"; \
	$$f run --batch demo/demo2.json --image $$image; \
	: "Demo 3: callbacks: a snippet in a --network none sandbox calls the host's tool server 20 times"; \
	$(GO) build -o bin/toolserver ./internal/testrig/cmd/toolserver; \
	d=$$(mktemp -d); sock=$$d/tools.sock; \
	bin/toolserver -listen $$sock > $$d/out 2>&1 & ts=$$!; \
	for i in $$(seq 100); do grep -q '^toolserver: listening' $$d/out && break; sleep 0.1; done; \
	grep -q '^toolserver: listening' $$d/out || { kill $$ts; cat $$d/out; rm -rf $$d; exit 1; }; \
	rc=0; $$f run --image $$image --network none --callback $$sock --callback-env HERMES_RPC_SOCKET demo/demo3.py || rc=$$?; \
	kill -TERM $$ts; wait $$ts; cat $$d/out; rm -rf $$d; test $$rc = 0; \
	: "Demo 1 again, as Flame runs it: flmbox instance under a simulated Flame executor, the three calls as tasks of one session over gRPC"; \
	$(GO) run ./internal/testrig/cmd/flamesim $$f instance --image $$image

vet:
	$(GO) vet ./...
	$(GO) vet -tags integration ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

# The race detector needs cgo (gcc is on the machine). Four packages at a
# time, not one for each CPU: linking race-instrumented test binaries and
# tests that wait for processes leave the CPUs half idle at two.
unit:
	CGO_ENABLED=1 $(GO) test -race -count=1 -p 4 ./...

# Each fuzz target mutates its seeds for FUZZTIME: a count of inputs, not a
# duration, as Go before 1.27 can fail a target with "context deadline
# exceeded" when a duration ends (golang/go#75804; it did here, at 8s). An
# input makes and removes a small tree, so the tests' temporary directories
# go to a tmpfs when there is one (on a disk, making and removing
# directories took most of each input's time); the test binary is still
# built in GOTMPDIR. An input that finds new code is minimised for
# FUZZ_MINIMIZE runs at most: Go's default, 60 s, spent a whole 20-s run
# minimising and the log said 0/sec.
FUZZ_MINIMIZE ?= 10x
FUZZ_TMPDIR   ?= $(shell test -d /dev/shm -a -w /dev/shm && echo /dev/shm || echo $${TMPDIR:-/tmp})
FUZZ          := GOTMPDIR=$${GOTMPDIR:-$${TMPDIR:-/tmp}} TMPDIR=$(FUZZ_TMPDIR) $(GO) test -run=NONE \
	-fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZ_MINIMIZE)
fuzz:
	$(FUZZ) -fuzz=FuzzUnpack ./rootfs/
	$(FUZZ) -fuzz=FuzzExtract ./internal/safetar/

# Integration tests need root, runsc and the test image; a missing piece fails them.
# Tests that share nothing run TEST_PARALLEL at a time (their sandboxes mostly
# wait); those that measure time or memory, or set the environment, run alone
# first. go test's output goes through slowest, which prints it as go test
# would without -json and then the 15 slowest tests.
TEST_PARALLEL ?= 4
# The official MCP TypeScript client, which the tests of flmbox mcp drive
# it with: Debian's nodejs and npm, the SDK pinned, in a cache of its own.
MCP_CLIENT_DIR ?= /var/cache/flmbox/mcp-client
MCP_SDK_VERSION ?= 1.32.2
mcpclient:
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@test -f $(MCP_CLIENT_DIR)/node_modules/@modelcontextprotocol/sdk/package.json || { \
		mkdir -p $(MCP_CLIENT_DIR) && cd $(MCP_CLIENT_DIR) && \
		{ test -f package.json || echo '{"name":"flmbox-mcp-client","private":true,"type":"module"}' > package.json; } && \
		npm install --no-audit --no-fund --silent @modelcontextprotocol/sdk@$(MCP_SDK_VERSION); }

integration: deps runsc mcpclient
	$(GO) build -o bin/slowest ./internal/testrig/cmd/slowest
	set -o pipefail; $(GO) test -json -count=1 -tags integration -timeout 40m -parallel $(TEST_PARALLEL) \
		./integration/ ./internal/testrig/testimage/ ./sandbox/ | bin/slowest -n 15

# Each stage in turn, its wall time said when it ends, then the total.
TEST_STAGES := deps runsc vet unit fuzz integration
test:
	@total=$$(date +%s); \
	for stage in $(TEST_STAGES); do \
		start=$$(date +%s); rc=0; \
		$(MAKE) --no-print-directory $$stage || rc=$$?; \
		took=$$(( $$(date +%s) - start )); \
		if [ $$rc != 0 ]; then \
			echo "make test: $$stage failed after $${took}s (total $$(( $$(date +%s) - total ))s)"; exit $$rc; \
		fi; \
		echo "make test: $$stage took $${took}s"; \
	done; \
	echo "make test: all stages took $$(( $$(date +%s) - total ))s"

# CPython's own tests (libpython3.11-testsuite), then numpy's, pandas' and
# scipy's own tests (pytest) and a data-science agent's workloads
# (multiprocessing, scikit-learn with loky, matplotlib, OpenBLAS), each in a
# variant of the test image that the test builds once per machine, under
# bare runsc and under flmbox, compared per test: every module (about 18
# minutes). make test runs the short list (CPython's, numpy's test_memmap and
# three workloads); docs/CONFORMANCE.md says what differs and why.
# CONFORMANCE=test_os,numpy.core.tests.test_umath,workloads for some modules.
CONFORMANCE ?= full
conformance: deps runsc
	FLMBOX_CONFORMANCE=$(CONFORMANCE) $(GO) test -count=1 -tags integration -timeout 2h -run '^TestConformance' -v ./integration/

# Side-by-side timings (never asserted): cold prewarm vs crane export | tar, cache-hit prewarm.
# flmbox bench on the test image, with crane for the prewarm baseline.
# BENCHFLAGS=--quick for a one-minute run; BENCHFLAGS=--json for the object.
bench: deps runsc build testimage
	@command -v crane >/dev/null || GOBIN=/usr/local/bin $(GO) install github.com/google/go-containerregistry/cmd/crane@v0.22.1
	@layout=$$(sed -n 's/.*"layout": *"\([^"]*\)".*/\1/p' bin/testimage.json); \
	index=$$(sed -n 's/.*"index_digest": *"\([^"]*\)".*/\1/p' bin/testimage.json); \
	$(FLMBOX) --root $(FLMBOX_ROOT) bench --image oci-layout:$$layout@$$index $(BENCHFLAGS)

# The Go code of Flame's Instance service (instance/flamepb), from its .proto:
# Debian's protoc and the pinned generators (committed; run after editing the .proto).
PROTOC_GEN_GO      := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
proto:
	@command -v protoc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler; }
	GOBIN=$(CURDIR)/bin/proto $(GO) install $(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/bin/proto $(GO) install $(PROTOC_GEN_GO_GRPC)
	PATH=$(CURDIR)/bin/proto:$$PATH protoc --proto_path=instance/flamepb \
		--go_out=instance/flamepb --go_opt=paths=source_relative \
		--go-grpc_out=instance/flamepb --go-grpc_opt=paths=source_relative instance/flamepb/instance.proto

clean:
	rm -rf bin
