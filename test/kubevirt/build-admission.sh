#!/usr/bin/env bash
# Builds kubevirt-admission, imagepipe's small webhook server around KubeVirt's own
# VirtualMachine admission code (test/kubevirt/admission), into
# ${IMAGEPIPE_BIN:-${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin}.
#
# The server links kubevirt.io/kubevirt from the Go module proxy, so it is built inside a copy
# of that module: the proxy serves it, but the checksum database does not know it (GONOSUMDB),
# and it refuses version lists of kubevirt.io modules, so the version is exact. The module's
# go.mod replaces kubevirt.io/api and kubevirt.io/client-go with folders under staging/ that
# the module zip lacks; each is pointed at the published module of the same version. Upstream's
# vendor/ folder is dropped (it is inconsistent with those replaces). Our sources go into the
# copy: the main package as cmd/imagepipe-admission, and admission/virthandler/livemigration.go
# into pkg/virt-handler, where the method computing a VMI's LiveMigratable condition lives.
#
# The stamp bin/.kubevirt-admission.version holds the KubeVirt version and a hash of our
# sources; a build whose stamp matches is skipped. Measured on 2 shared cores: about 6.5 minutes
# with an empty build cache (the module cache already filled), 10 s when only our sources changed.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
bin="${IMAGEPIPE_BIN:-${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin}"
mkdir -p "$bin"

kubevirt_version=v1.8.0
src="$here/admission"
src_hash="$(cd "$src" && find . -type f \( -name '*.go' -o -name go.mod \) | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
stamp="kubevirt.io/kubevirt@$kubevirt_version src-$src_hash"
if [ -x "$bin/kubevirt-admission" ] && [ -f "$bin/.kubevirt-admission.version" ] &&
	[ "$(cat "$bin/.kubevirt-admission.version")" = "$stamp" ]; then
	echo "kubevirt-admission: cached ($stamp)"
	exit 0
fi

start=$SECONDS
export GOTOOLCHAIN=local GOFLAGS=-mod=mod GONOSUMDB=kubevirt.io GOWORK=off CGO_ENABLED=0
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
rm -f "$bin/.kubevirt-admission.version"

dir="$(cd "$work" && go mod download -json "kubevirt.io/kubevirt@$kubevirt_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
if [ -z "$dir" ]; then
	echo "kubevirt-admission: could not download kubevirt.io/kubevirt@$kubevirt_version" >&2
	exit 1
fi
tree="$work/kubevirt"
cp -r "$dir" "$tree"
chmod -R u+w "$tree"
rm -rf "$tree/vendor" "$tree/go.work" "$tree/go.work.sum"

cd "$tree"
staged="$(sed -n 's|^[[:space:]]*\(kubevirt.io/[^[:space:]]*\) => \./staging/.*$|\1|p' go.mod)"
case " $(echo $staged) " in
*" kubevirt.io/client-go "*) ;;
*)
	echo "kubevirt-admission: found no staging replace of kubevirt.io/client-go in kubevirt.io/kubevirt@$kubevirt_version's go.mod" >&2
	exit 1
	;;
esac
for m in $staged; do
	go mod edit -replace "$m=$m@$kubevirt_version"
done

mkdir -p cmd/imagepipe-admission
cp "$src"/*.go cmd/imagepipe-admission/
cp "$src/virthandler/livemigration.go" pkg/virt-handler/zz_imagepipe_livemigration.go

go build -trimpath -ldflags '-s -w' -o "$bin/kubevirt-admission" ./cmd/imagepipe-admission
echo "$stamp" >"$bin/.kubevirt-admission.version"
echo "kubevirt-admission: built ($stamp) in $((SECONDS - start)) s"
