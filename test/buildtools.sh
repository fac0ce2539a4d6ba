#!/usr/bin/env bash
# Builds the real components imagepipe's integration tests and benchmarks run
# (the CNCF distribution registry, MinIO, crane) from the Go module proxy into
# ${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin, unless IMAGEPIPE_BIN names
# another folder. Each tool has a stamp file (bin/.NAME.version) holding the
# module@version it was built from; a tool whose stamp matches is not rebuilt,
# so a rerun with everything cached takes well under a second.
#
# The first build takes several minutes on 2 cores (measured with a cold build
# cache: registry ~110 s, MinIO ~3 min); they run one after another so as not
# to starve the machine. A rebuild with a warm GOCACHE takes seconds.
set -euo pipefail

bin="${IMAGEPIPE_BIN:-${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin}"
mkdir -p "$bin"

# Exact versions: the module proxy refuses version lists for some modules, and
# MinIO publishes no semver tags, so it is pinned to the pseudo-version that
# `go install github.com/minio/minio@latest` resolved to with Go 1.26.
tools=(
	"registry github.com/distribution/distribution/v3/cmd/registry@v3.1.2"
	"minio github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"
	"crane github.com/google/go-containerregistry/cmd/crane@v0.22.1"
)

for entry in "${tools[@]}"; do
	name="${entry%% *}"
	pkg="${entry#* }"
	stamp="$bin/.$name.version"
	if [ -x "$bin/$name" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkg" ]; then
		echo "$name: cached ($pkg)"
		continue
	fi
	start=$SECONDS
	rm -f "$stamp"
	# Build outside any module so the project's go.mod plays no part;
	# GOTOOLCHAIN=local because no other toolchain can be downloaded here.
	(cd / && GOBIN="$bin" GOFLAGS=-mod=mod GOTOOLCHAIN=local go install "$pkg")
	echo "$pkg" >"$stamp"
	echo "$name: built ($pkg) in $((SECONDS - start)) s"
done
