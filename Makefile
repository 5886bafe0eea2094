# Kylix build. Plain `go build ./...`, `go test ./...` and `go install ./cmd/kylix`
# work too; LDFLAGS (empty by default) is passed to every go command below.
GO       ?= go
LDFLAGS  ?=
GOFLAGS_ := $(if $(LDFLAGS),-ldflags='$(LDFLAGS)')
# The version and commit kylix --version prints (scripts/version.sh: from git,
# or from what git archive wrote into a tarball; nothing without either),
# for the binaries make builds; LDFLAGS given on the command line comes after.
VERSION_LDFLAGS := $(shell bash scripts/version.sh 2>/dev/null)
BUILDFLAGS_ := -ldflags='$(strip $(VERSION_LDFLAGS) $(LDFLAGS))'
BIN      := bin/kylix
# Packages where the race detector is affordable on a 2-core machine.
RACE_PKGS := ./chunkstore/... ./cuda/... ./gpuio/... ./fs/... ./node/... ./internal/...
export CGO_ENABLED ?= 0

.PHONY: all build test test-deps test-unit test-race test-c lint bench run clean fuzz tools gpu-build libkylix

all: build

build: libkylix
	$(GO) build $(BUILDFLAGS_) -o $(BIN) ./cmd/kylix

# libkylix (contrib/libkylix, C11): bin/libkylix.so and its test binaries.
# Skipped, saying so, where no C compiler is installed (.ci/run installs one).
CC ?= cc
libkylix:
	@if command -v $(CC) >/dev/null 2>&1; then $(MAKE) -s -C contrib/libkylix CC=$(CC) all; \
	  else echo "libkylix: no C compiler ($(CC)); bin/libkylix.so not built (apt-get install gcc libc6-dev)"; fi

# The test command CI runs: installs the real clients the tests need where
# missing (as root with apt-get; scripts/test-deps.sh), then unit tests, race
# detector, the real-process, FUSE and real-client suites in ./test (the
# README's tour among them: TestTour), libkylix's and the Python package's.
# A client still missing fails the run unless KYLIX_TEST_ALLOW_SKIP=1.
# scripts/make-test.sh runs the steps in order, stopping at the first that
# fails, and ends with one summary: steps passed, failed, not run, and what
# they said they skipped.
TEST_STEPS := test-deps build lint test-unit test-race test-c test-python
test:
	@MAKE="$(MAKE)" bash scripts/make-test.sh $(TEST_STEPS)

test-deps:
	bash scripts/test-deps.sh

# libkylix's C tests: symbols, unit and fuzz (plain and ASan+UBSan), the
# parser against Python's, and reads through a live mount (root, /dev/fuse).
test-c: build
	@if command -v $(CC) >/dev/null 2>&1; then bash contrib/libkylix/tests/run.sh; \
	  elif [ "$$KYLIX_TEST_ALLOW_SKIP" = 1 ]; then echo "test-c: no C compiler ($(CC)); libkylix tests skipped (KYLIX_TEST_ALLOW_SKIP=1)"; \
	  else echo "test-c: missing client: no C compiler ($(CC)): apt-get install -y gcc libc6-dev (KYLIX_TEST_ALLOW_SKIP=1 skips)" >&2; exit 1; fi

test-unit:
	$(GO) test $(GOFLAGS_) -count=1 ./...

test-race:
	CGO_ENABLED=1 $(GO) test $(GOFLAGS_) -race -count=1 -short $(RACE_PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if command -v staticcheck >/dev/null 2>&1; then staticcheck ./...; \
	  else echo "staticcheck not installed; skipped (make tools)"; fi

tools:
	$(GO) install honnef.co/go/tools/cmd/staticcheck@v0.7.0

# Fuzz each parser for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	$(GO) test $(GOFLAGS_) ./chunkstore/safetensors -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME)
	$(GO) test $(GOFLAGS_) ./chunkstore -run '^$$' -fuzz FuzzDecodeFileManifest -fuzztime $(FUZZTIME)
	$(GO) test $(GOFLAGS_) ./chunkstore -run '^$$' -fuzz FuzzDecodeDirManifest -fuzztime $(FUZZTIME)

# Side-by-side benchmarks (store, FUSE); results go to docs/bench.md by hand.
bench: build
	bash test/bench/run.sh

# The embedded default: a single node on the default data directory with a
# sample model imported.
run: build
	bash scripts/run.sh

# Static binaries for the GPU machine (no Go, no CUDA needed to build):
# then run scripts/gpu-test.sh or scripts/gpu-bench.sh there, carrying .gpu.
gpu-build:
	mkdir -p .gpu
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS_) -o .gpu/kylix ./cmd/kylix
	CGO_ENABLED=0 $(GO) test -c $(GOFLAGS_) -o .gpu/cuda.test ./cuda
	CGO_ENABLED=0 $(GO) test -c $(GOFLAGS_) -o .gpu/gpuio.test ./gpuio
	CGO_ENABLED=0 $(GO) test -c $(GOFLAGS_) -o .gpu/chunkstore.test ./chunkstore
	CGO_ENABLED=0 $(GO) test -c $(GOFLAGS_) -o .gpu/gpublake3.test ./cuda/gpublake3
	CGO_ENABLED=0 $(GO) test -c $(GOFLAGS_) -o .gpu/safetensors.test ./chunkstore/safetensors
	CGO_ENABLED=0 $(GO) test -c $(GOFLAGS_) -o .gpu/demomodel.test ./internal/demomodel

clean:
	rm -rf bin
	$(MAKE) -s -C contrib/libkylix clean

# Python package (contrib/python, import name kylix): `make python` builds the
# wheel into bin/ with the standard library only, with bin/libkylix.so inside
# when it exists; the Python tests join `make test` (Debian's python3-torch and
# python3-numpy; /usr/bin/python3 because that is where they are installed).
PYTHON ?= /usr/bin/python3
.PHONY: python test-python
python: build
	$(PYTHON) contrib/python/build_wheel.py bin --lib bin/libkylix.so

test-python: build
	cd contrib/python && $(PYTHON) -m unittest discover -s tests -v
