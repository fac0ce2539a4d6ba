#!/usr/bin/env bash
# Builds the real components imagepipe's integration tests and benchmarks run
# from the Go module proxy into ${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin,
# unless IMAGEPIPE_BIN names another folder: the CNCF distribution registry,
# MinIO, crane, etcd, zot, kube-apiserver, kubectl, kube-controller-manager,
# cdi-controller and cdi-importer. It also generates the CDI,
# KubeVirt and instancetype CRDs (with their real schemas, by controller-gen from
# the published API modules) into ${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/crds.
# Each tool has a stamp file (bin/.NAME.version, crds/.version) holding what it
# was built from; a tool whose stamp matches is not rebuilt, so a rerun with
# everything cached takes well under a second.
#
# The first build takes about ten minutes on 2 cores (measured with a cold
# build cache: registry ~110 s, MinIO ~3 min, etcd ~1 min, kube-apiserver ~4 min,
# kubectl ~25 s more, CRDs ~15 s); they run one after another so as not to
# starve the machine. A rebuild with a warm GOCACHE takes seconds.
#
# etcd, kube-apiserver, kubectl and the CRDs are built in throwaway modules in a
# temporary folder, so their dependencies never touch the project's go.mod.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
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

# Versions of the Kubernetes side; the proxy refuses version lists for
# kubevirt.io modules, so every version here is exact.
etcd_version=v3.6.5
kube_version=v1.34.4 # k8s.io/kubernetes; its staging modules are v0.X.Y
controller_gen_version=v0.23.0
kubevirt_api_version=v1.8.0
cdi_api_version=v1.64.0

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

# quiet runs a command with its output kept back unless it fails.
quiet() {
	local log="$work/quiet.log"
	if ! "$@" >"$log" 2>&1; then
		cat "$log" >&2
		return 1
	fi
}

# cached NAME STAMP reports whether bin/NAME exists and was built from STAMP.
cached() {
	[ -x "$bin/$1" ] && [ -f "$bin/.$1.version" ] && [ "$(cat "$bin/.$1.version")" = "$2" ]
}

# etcd: a tiny main calling etcdmain.Main, the way etcd's own binary does.
stamp="go.etcd.io/etcd/server/v3@$etcd_version"
if cached etcd "$stamp"; then
	echo "etcd: cached ($stamp)"
else
	start=$SECONDS
	rm -f "$bin/.etcd.version"
	mkdir "$work/etcd"
	cat >"$work/etcd/main.go" <<'GO'
// Command etcd runs etcd's own main, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
	(
		cd "$work/etcd"
		quiet go mod init imagepipe.invalid/tools/etcd
		quiet go get "$stamp"
		quiet go mod tidy
		go build -trimpath -o "$bin/etcd" .
	)
	echo "$stamp" >"$bin/.etcd.version"
	echo "etcd: built ($stamp) in $((SECONDS - start)) s"
fi

# zot: an OCI registry with per-repository access control (htpasswd users and
# accessControl policies), for the test that a tenant's pull secret cannot read
# another tenant's repositories. Its releases declare the module path
# zotregistry.io/zot (later zotregistry.dev/zot/v2), which the module proxy does
# not serve; v1.4.3 is served under github.com/project-zot/zot, so its source is
# downloaded from there and built in place with its own go.mod. Without cgo, the
# containers_image_openpgp tag replaces gpgme. About 100 s with a cold cache.
zot_version=v1.4.3
stamp="github.com/project-zot/zot/cmd/zot@$zot_version tags=containers_image_openpgp"
if cached zot "$stamp"; then
	echo "zot: cached ($stamp)"
else
	start=$SECONDS
	rm -f "$bin/.zot.version"
	src="$(cd "$work" && go mod download -json "github.com/project-zot/zot@$zot_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
	cp -r "$src" "$work/zot"
	chmod -R u+w "$work/zot"
	(cd "$work/zot" && CGO_ENABLED=0 go build -trimpath -tags containers_image_openpgp -o "$bin/zot" ./cmd/zot)
	echo "$stamp" >"$bin/.zot.version"
	echo "zot: built ($stamp) in $((SECONDS - start)) s"
fi

# kube-apiserver, kubectl and kube-controller-manager from k8s.io/kubernetes.
# The controller manager runs the controllers CDI's objects rely on (garbage
# collection of owned PVCs, persistent-volume binding, PVC protection). Its go.mod replaces every
# staging module (k8s.io/api, k8s.io/client-go, ...) with a folder of its own
# repository; outside it each must be replaced by its published release, whose
# version is the Kubernetes version with major 0 (v1.34.4 -> v0.34.4).
kube_cmds=(kube-apiserver kubectl kube-controller-manager)
kube_stamp() { echo "k8s.io/kubernetes/cmd/$1@$kube_version"; }
kube_missing=()
for cmd in "${kube_cmds[@]}"; do
	if cached "$cmd" "$(kube_stamp "$cmd")"; then
		echo "$cmd: cached ($(kube_stamp "$cmd"))"
	else
		kube_missing+=("$cmd")
	fi
done
if [ ${#kube_missing[@]} -gt 0 ]; then
	start=$SECONDS
	mod="$work/kube"
	mkdir "$mod"
	kube_gomod="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$kube_version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
	staging="v0.${kube_version#v1.}"
	{
		echo "module imagepipe.invalid/tools/kube"
		echo
		echo "go $(go env GOVERSION | sed 's/^go//')"
		echo
		echo "require k8s.io/kubernetes $kube_version"
		echo
		echo "replace ("
		sed -n 's|^[[:space:]]*\(k8s.io/[^[:space:]]*\) => \./staging/.*$|\t\1 => \1 '"$staging"'|p' "$kube_gomod"
		echo ")"
	} >"$mod/go.mod"
	if ! grep -q 'k8s.io/client-go => ' "$mod/go.mod"; then
		echo "kube-apiserver: found no staging replaces in $kube_gomod" >&2
		exit 1
	fi
	{
		echo '//go:build tools'
		echo
		echo '// Package tools records the commands this throwaway module builds.'
		echo 'package tools'
		echo
		echo 'import ('
		for cmd in "${kube_cmds[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$cmd\""; done
		echo ')'
	} >"$mod/tools.go"
	# Stamp the version the way Kubernetes' own build does, so /version and
	# kubectl report v1.34.4 instead of v0.0.0-master.
	minor="${kube_version#v1.}"
	minor="${minor%%.*}"
	ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
	ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
	ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
	(cd "$mod" && quiet go mod tidy)
	for cmd in "${kube_missing[@]}"; do
		t0=$SECONDS
		rm -f "$bin/.$cmd.version"
		(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd" "k8s.io/kubernetes/cmd/$cmd")
		kube_stamp "$cmd" >"$bin/.$cmd.version"
		echo "$cmd: built ($(kube_stamp "$cmd")) in $((SECONDS - t0)) s"
	done
	echo "${kube_missing[*]}: $((SECONDS - start)) s in all"
fi

# CRDs of CDI, KubeVirt and KubeVirt's instancetypes, generated by controller-gen
# from the kubebuilder markers of the published API modules.
crds="${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/crds"
# The stamp's last word names the revision of the fix-ups below.
stamp="controller-gen@$controller_gen_version kubevirt.io/api@$kubevirt_api_version kubevirt.io/containerized-data-importer-api@$cdi_api_version fixups-1"
if [ -f "$crds/.version" ] && [ "$(cat "$crds/.version")" = "$stamp" ]; then
	echo "crds: cached ($stamp)"
else
	start=$SECONDS
	mod="$work/crds"
	mkdir -p "$mod" "$work/gobin"
	(cd "$work" && GOBIN="$work/gobin" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$controller_gen_version")
	cat >"$mod/tools.go" <<'GO'
//go:build tools

// Package tools makes the API packages controller-gen reads part of this module.
package tools

import (
	_ "kubevirt.io/api/core/v1"
	_ "kubevirt.io/api/instancetype/v1beta1"
	_ "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)
GO
	out="$work/crds-out"
	(
		cd "$mod"
		quiet go mod init imagepipe.invalid/tools/crds
		quiet go get "kubevirt.io/api@$kubevirt_api_version" "kubevirt.io/containerized-data-importer-api@$cdi_api_version"
		quiet go mod tidy
		for entry in \
			"cdi kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1" \
			"kubevirt kubevirt.io/api/core/v1" \
			"instancetype kubevirt.io/api/instancetype/v1beta1"; do
			"$work/gobin/controller-gen" crd:allowDangerousTypes=true "paths=${entry#* }" "output:crd:dir=$out/${entry%% *}"
		done
	)
	# A type controller-gen finds but KubeVirt serves no resource for.
	rm -f "$out/kubevirt/kubevirt.io_datavolumetemplatespecs.yaml"
	# kubevirt.io/api marks its cluster-wide kinds only for client-gen
	# (+genclient:nonNamespaced), which controller-gen does not read, and leaves
	# subresources to virt-operator: make the CRDs what virt-operator installs.
	for kind in virtualmachineclusterinstancetypes virtualmachineclusterpreferences; do
		f="$out/instancetype/instancetype.kubevirt.io_$kind.yaml"
		sed -i 's/^  scope: Namespaced$/  scope: Cluster/' "$f"
		grep -q '^  scope: Cluster$' "$f" || { echo "crds: could not make $kind cluster-scoped" >&2; exit 1; }
	done
	f="$out/kubevirt/kubevirt.io_virtualmachines.yaml"
	if ! grep -q '^    subresources:' "$f"; then
		sed -i 's/^    storage: true$/&\n    subresources:\n      status: {}/' "$f"
		grep -q '^      status: {}$' "$f" || { echo "crds: could not add the VirtualMachine status subresource" >&2; exit 1; }
	fi
	echo "$stamp" >"$out/.version"
	mkdir -p "$(dirname "$crds")"
	rm -rf "$crds"
	mv "$out" "$crds"
	echo "crds: generated ($stamp) in $((SECONDS - start)) s: $(find "$crds" -name '*.yaml' | wc -l) files"
fi

# CDI's real controller and importer (cdi-controller, cdi-importer), which test
# hubs run (test/nodestandin). The module proxy serves
# kubevirt.io/containerized-data-importer but the checksum database does not
# know it (GONOSUMDB); its go.mod replaces the API module with a staging folder
# the module zip lacks (pointed at the published module instead); and the
# proxy refuses libguestfs.org/libnbd, which only CDI's VDDK source uses:
# test/cdi/libnbd stands in for it, failing every call. cgo is on, as in
# CDI's own build. About 4 minutes for both with a cold build cache.
cdi_version=v1.64.0
cdi_stamp() { echo "kubevirt.io/containerized-data-importer/cmd/$1@$cdi_version libnbd-stub-1"; }
cdi_missing=()
for cmd in cdi-controller cdi-importer; do
	if cached "$cmd" "$(cdi_stamp "$cmd")"; then
		echo "$cmd: cached ($(cdi_stamp "$cmd"))"
	else
		cdi_missing+=("$cmd")
	fi
done
if [ ${#cdi_missing[@]} -gt 0 ]; then
	start=$SECONDS
	dir="$(cd "$work" && GONOSUMDB=kubevirt.io go mod download -json "kubevirt.io/containerized-data-importer@$cdi_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
	cp -r "$dir" "$work/cdi"
	chmod -R u+w "$work/cdi"
	rm -rf "$work/cdi/vendor"
	cp -r "$here/cdi/libnbd" "$work/libnbd"
	(
		cd "$work/cdi"
		go mod edit \
			-replace "kubevirt.io/containerized-data-importer-api=kubevirt.io/containerized-data-importer-api@$cdi_version" \
			-replace "libguestfs.org/libnbd=$work/libnbd"
		for cmd in "${cdi_missing[@]}"; do
			t0=$SECONDS
			rm -f "$bin/.$cmd.version"
			GONOSUMDB=kubevirt.io CGO_ENABLED=1 go build -trimpath -o "$bin/$cmd" "./cmd/$cmd"
			cdi_stamp "$cmd" >"$bin/.$cmd.version"
			echo "$cmd: built ($(cdi_stamp "$cmd")) in $((SECONDS - t0)) s"
		done
	)
	echo "${cdi_missing[*]}: $((SECONDS - start)) s in all"
fi
