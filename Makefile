# imagepipe — build, test and benchmark.
# `make test` and `make bench` install what they need themselves (make tools).

GO        ?= go
BIN       := $(CURDIR)/bin
CACHE     ?= $(HOME)/.cache/imagepipe
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS   := -X github.com/imagepipe/imagepipe/internal/version.Version=$(VERSION) -X github.com/imagepipe/imagepipe/internal/version.Commit=$(COMMIT)
FUZZTIME  ?= 10s
# imagectl compresses gzip layers with Intel ISA-L's igzip (several times
# faster), so `make build` needs libisal-dev (make tools installs it) and
# fails without it rather than build another imagectl. `make build TAGS=`
# chooses the pure-Go klauspost/pgzip build, as the container image has.
TAGS      ?= isal
# Fuzz targets as package:target pairs; `make fuzz` runs each for FUZZTIME.
FUZZ_TARGETS := ./internal/convert:FuzzOpen ./internal/convert:FuzzQCOW2Header ./internal/convert:FuzzL2Table ./internal/convert:FuzzTableSharing ./internal/convert:FuzzUnwrap ./internal/convert:FuzzDetect ./internal/containerdisk:FuzzDiskEntry ./internal/containerdisk:FuzzZstdAgainstCDI ./internal/containerdisk:FuzzZstdFrames ./internal/imageref:FuzzParseReference ./internal/intake:FuzzParseWebhook ./internal/cdi:FuzzNames ./internal/ocidoc:FuzzParseDocument ./internal/guest:FuzzProbe ./internal/guest:FuzzFATLoaders ./internal/guest:FuzzExt4OSRelease ./internal/guest:FuzzPackageURL ./internal/guest:FuzzXFS ./internal/guest:FuzzRPMDB ./internal/guest:FuzzLVM ./internal/guest:FuzzAPK ./internal/guest:FuzzNTFS ./internal/guest:FuzzRegistry ./internal/hub:FuzzParsePreferenceTable

# Tests run through hack/testreport: it prints what go test would, and fails
# the run when a test skips for a reason outside internal/need's allow-list
# (a missing tool, privilege or server).
REPORT := $(GO) run ./hack/testreport
SHELL := bash
.SHELLFLAGS := -o pipefail -c

CONTROLLER_GEN := $(GO) tool controller-gen # pinned in go.mod: lint needs no network

# Builds run the compiler and linker with less garbage collection: a tenth
# less CPU from an empty build cache (kubectl measured: 226 CPU-seconds
# against 252), at a memory cost GOMEMLIMIT caps per process. Test binaries
# run with Go's defaults (TEST_EXEC), since some tests measure memory.
GOBUILD   := GOGC=400 GOMEMLIMIT=4GiB $(GO)
TEST_EXEC := -exec 'env -u GOGC -u GOMEMLIMIT'

.PHONY: all build test unit integration fuzz bench tools lint generate demo clean images release-config

all: build

# NEED_ISAL stops a recipe that compiles the isal build where libisal-dev is missing.
NEED_ISAL = @case " $(TAGS) " in *" isal "*) test -f /usr/include/isa-l/igzip_lib.h || { echo "libisal-dev is not installed: run make tools (or make $@ TAGS= for the pure-Go gzip)"; exit 1; };; esac

# image-syncer and image-gate are built as their container images build them (hack/imagebuild:
# no cgo, -trimpath), so the tests run that binary and make images reuses
# the compiled packages.
build:
	$(NEED_ISAL)
	$(GOBUILD) build -tags "$(TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/imagectl ./cmd/imagectl
	CGO_ENABLED=0 $(GOBUILD) build -trimpath -buildvcs=false -ldflags "$(LDFLAGS)" -o $(BIN)/image-syncer ./cmd/image-syncer
	CGO_ENABLED=0 $(GOBUILD) build -trimpath -buildvcs=false -ldflags "$(LDFLAGS)" -o $(BIN)/image-gate ./cmd/image-gate

# images builds the image-syncer and imagectl container images without a
# container runtime (hack/imagebuild): static binaries for linux/amd64 and
# linux/arm64 on a base of users, /tmp and a CA bundle, running as 65532,
# with an SPDX SBOM each; and pushes them as OCI indexes to
# $(IMG_REGISTRY)/image-syncer:$(IMG_TAG) and $(IMG_REGISTRY)/imagectl:$(IMG_TAG),
# printing each REF@DIGEST. The same commit gives the same digests. Registry
# credentials come from ~/.docker/config.json; IMG_INSECURE=1 allows plain
# HTTP (127.0.0.1 and localhost do without it); IMG_SBOM=0 skips the SBOMs
# for a registry that refuses OCI artifacts.
# release-config does the same, then pins the image-syncer index by digest
# in $(IMG_KUSTOMIZATION) (config/default), for `kubectl apply -k`.
IMG_REGISTRY      ?=
IMG_TAG           ?= $(VERSION)
IMG_INSECURE      ?=
IMG_SBOM          ?= 1
IMG_KUSTOMIZATION ?= config/default/kustomization.yaml
IMAGEBUILD = $(GO) run ./hack/imagebuild -registry "$(IMG_REGISTRY)" -tag "$(IMG_TAG)" -version "$(VERSION)" \
	$(if $(filter 1 true yes,$(IMG_INSECURE)),-insecure) $(if $(filter 0 false no,$(IMG_SBOM)),-sbom=false)

images:
	@test -n "$(IMG_REGISTRY)" || { echo "usage: make $@ IMG_REGISTRY=HOST[:PORT]/PATH [IMG_TAG=$(VERSION)] [IMG_INSECURE=1]"; exit 2; }
	$(IMAGEBUILD)

release-config:
	@test -n "$(IMG_REGISTRY)" || { echo "usage: make $@ IMG_REGISTRY=HOST[:PORT]/PATH [IMG_TAG=$(VERSION)] [IMG_INSECURE=1]"; exit 2; }
	$(IMAGEBUILD) -kustomization "$(IMG_KUSTOMIZATION)"

# tools installs the system packages the tests use (qemu-img/qemu-io as the
# oracle, skopeo, mkfs.ext4, GNU time, zstd, libisal-dev) when they are
# missing, and builds the real servers from the Go module proxy into
# $(CACHE)/bin: the CNCF distribution registry, MinIO, crane, zot, etcd,
# kube-apiserver, kubectl, kube-controller-manager, CDI's controller and
# importer, plus the CDI and KubeVirt CRDs (test/buildtools.sh and, alongside,
# test/buildkube.sh; cached,
# 22 minutes the first time on 2 cores, measured), and the guests test/guest
# boots in QEMU, built from Debian packages into $(CACHE)/guests
# (test/guests.sh; cached by their packages' versions).
tools:
	@IMAGEPIPE_CACHE=$(CACHE) bash test/tools.sh

test: tools lint build unit integration fuzz

# go test starts packages in the order it is given them, so the longest are
# named first (measured with a warm cache): the others then fill the cores
# while they run, instead of the longest starting last.
UNIT_FIRST        := ./internal/bootcheck ./internal/source ./internal/convert ./internal/registry ./internal/containerdisk ./internal/gate
INTEGRATION_FIRST := ./test/syncer ./test/hub ./test/images ./test/hostile ./test/registry
# test/guest boots guests under TCG, whose pace is the CPU QEMU gets: beside
# test/images' cross-compiles a Debian boot took over 15 minutes instead of
# one. It runs alone, after the others.
INTEGRATION_ALONE := ./test/guest

# Unit tests and fuzzers find the tools make tools built (a reference
# decoder) in $(CACHE)/bin.
unit:
	IMAGEPIPE_BIN=$(CACHE)/bin $(GOBUILD) test $(TEST_EXEC) -json -tags "$(TAGS)" -race -count=1 -timeout 30m $(UNIT_FIRST) ./internal/... ./pkg/... ./cmd/... ./hack/... 2>&1 | $(REPORT)
	$(GOBUILD) test $(TEST_EXEC) -json -count=1 -run Gzip ./internal/containerdisk 2>&1 | $(REPORT) # the pure-Go gzip fallback

# test/images cross-compiles both binaries for two platforms from a cold
# build cache on a fresh machine, which can pass go test's default 10m.
# Four packages run at once (-p 4, twice the cores of a small CI machine):
# most of their time is spent waiting on the servers they start.
integration: build
	IMAGECTL=$(BIN)/imagectl IMAGE_SYNCER=$(BIN)/image-syncer IMAGE_GATE=$(BIN)/image-gate IMAGEPIPE_CACHE=$(CACHE) $(GOBUILD) test $(TEST_EXEC) -json -count=1 -p 4 -timeout 60m $(INTEGRATION_FIRST) $$(go list ./test/... | grep -v '/test/guest$$') 2>&1 | $(REPORT)
	IMAGECTL=$(BIN)/imagectl IMAGE_SYNCER=$(BIN)/image-syncer IMAGE_GATE=$(BIN)/image-gate IMAGEPIPE_CACHE=$(CACHE) $(GOBUILD) test $(TEST_EXEC) -json -count=1 -timeout 30m $(INTEGRATION_ALONE) 2>&1 | $(REPORT)

fuzz:
	@IMAGEPIPE_BIN=$(CACHE)/bin GOGC=400 GOMEMLIMIT=4GiB FUZZTIME=$(FUZZTIME) bash test/fuzz.sh $(FUZZ_TARGETS) # as GOBUILD: the fuzzers measure no memory

bench: tools build
	IMAGECTL=$(BIN)/imagectl IMAGEPIPE_CACHE=$(CACHE) bash test/bench/bench.sh

# lint runs staticcheck at the version test/buildtools.sh pins, which it
# builds into $(CACHE)/bin the first time (about a minute), on both gzip
# builds at once (-matrix): the pure-Go one, and the isal one unless TAGS=
# leaves it out. A name unused in one build but used in the other is no
# finding.
STATICCHECK_MATRIX := pgzip:\n$(if $(filter isal,$(TAGS)),isal: -tags=isal\n)

lint:
	$(NEED_ISAL)
	@out=$$(gofmt -l cmd hack internal pkg test); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GOBUILD) vet ./...
	@IMAGEPIPE_BIN=$(CACHE)/bin bash test/buildtools.sh staticcheck
	printf '$(STATICCHECK_MATRIX)' | $(CACHE)/bin/staticcheck -matrix ./...
	@# go.mod must be tidy: .ci/run builds with -mod=mod, which would rewrite it mid-run and
	@# stamp the binaries built afterwards "-dirty" (a different build key for the same image).
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1; }
	@# No build output or other large file in the repository: every tracked file is under 1 MB.
	@if git rev-parse --git-dir >/dev/null 2>&1; then 	big=$$(git ls-files -z | xargs -0 stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 {print $$2 " (" $$1 " bytes)"}'); 	if [ -n "$$big" ]; then echo "tracked files over 1 MB (build outputs belong in bin/ or the cache):"; echo "$$big"; exit 1; fi; fi
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(CONTROLLER_GEN) crd paths=./pkg/api/v1alpha1/... output:crd:dir=$$tmp && \
	diff -r $$tmp config/crd --exclude=kustomization.yaml || { echo "config/crd is stale: run make generate"; exit 1; }

# generate writes the BaseImage deepcopy code and CRD manifest (config/crd).
generate:
	$(CONTROLLER_GEN) object paths=./pkg/api/v1alpha1/... crd paths=./pkg/api/v1alpha1/... output:crd:dir=config/crd

# docs regenerates the CLI reference in docs/cli from the commands' help.
# TestCLIReferenceIsCurrent (cmd/imagectl, cmd/image-syncer), which `make
# unit` runs, fails while the reference is stale.
.PHONY: docs
docs:
	UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestCLIReferenceIsCurrent$$' ./cmd/imagectl ./cmd/image-syncer ./cmd/image-gate

# demo runs the whole pipeline on 127.0.0.1 and explains each step (test/demo): the registry,
# MinIO, two hubs with an image-syncer each; an import from S3, its replication, a VM, a new
# version and a delete. It stops everything it started at the end or on Ctrl-C, and keeps the
# logs in $(CACHE)/demo/logs. `make test` runs its short mode (TestDemo in test/demo).
demo: tools build
	$(GO) build -o $(BIN)/demo ./test/demo
	exec env IMAGEPIPE_CACHE=$(CACHE) $(BIN)/demo -imagectl $(BIN)/imagectl -image-syncer $(BIN)/image-syncer -image-gate $(BIN)/image-gate

clean:
	rm -rf $(BIN)
