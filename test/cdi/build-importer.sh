#!/usr/bin/env bash
# Builds CDI's real importer (cdi-importer) from the Go module proxy into
# ${IMAGEPIPE_BIN:-${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin}, with a
# version stamp like test/buildtools.sh's tools. About 2.5 minutes on 2
# cores with a warm module cache.
#
# The proxy serves kubevirt.io/containerized-data-importer but the checksum
# database does not know it (GONOSUMDB), its go.mod replaces the API module
# with a staging folder the module zip lacks (pointed at the published
# module instead), and it refuses libguestfs.org/libnbd, which only CDI's
# VDDK source uses: test/cdi/libnbd stands in for it, failing every call.
#
# Not yet part of `make tools`: the node stand-in that runs the importer
# for tests (issue 12) comes next.
set -euo pipefail
cdi_version=v1.64.0
here="$(cd "$(dirname "$0")" && pwd)"
bin="${IMAGEPIPE_BIN:-${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin}"
stamp="$bin/.cdi-importer.version"
want="kubevirt.io/containerized-data-importer/cmd/cdi-importer@$cdi_version libnbd-stub-1"
if [ -x "$bin/cdi-importer" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
	echo "cdi-importer: cached ($want)"
	exit 0
fi
mkdir -p "$bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod GONOSUMDB=kubevirt.io
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
start=$SECONDS
dir="$(cd / && go mod download -json "kubevirt.io/containerized-data-importer@$cdi_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
cp -r "$dir" "$work/cdi" && chmod -R u+w "$work/cdi" && rm -rf "$work/cdi/vendor"
cp -r "$here/libnbd" "$work/libnbd"
cd "$work/cdi"
go mod edit \
	-replace "kubevirt.io/containerized-data-importer-api=kubevirt.io/containerized-data-importer-api@$cdi_version" \
	-replace "libguestfs.org/libnbd=$work/libnbd"
rm -f "$stamp"
CGO_ENABLED=1 go build -o "$bin/cdi-importer" ./cmd/cdi-importer
echo "$want" >"$stamp"
echo "cdi-importer: built ($want) in $((SECONDS - start)) s"
