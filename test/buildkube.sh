#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and kube-controller-manager from k8s.io/kubernetes
# (the Go module proxy) into ${IMAGEPIPE_BIN:-${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin},
# each with a stamp file as in test/buildtools.sh. test/tools.sh runs it alongside
# buildtools.sh: these three are the longest build (about half of the tools' time on a
# fresh machine), and the other builds fill the gaps it leaves on the cores (module
# downloads, single-threaded links).
set -euo pipefail

# shellcheck source=buildlib.sh
. "$(dirname "$0")/buildlib.sh"

kube_version=v1.34.4 # k8s.io/kubernetes; its staging modules are v0.X.Y

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
	# One go build for all of them: the packages they share are compiled
	# once, and one binary links while the next one's packages compile.
	pkgs=()
	for cmd in "${kube_missing[@]}"; do
		rm -f "$bin/.$cmd.version"
		pkgs+=("k8s.io/kubernetes/cmd/$cmd")
	done
	(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/" "${pkgs[@]}")
	for cmd in "${kube_missing[@]}"; do
		kube_stamp "$cmd" >"$bin/.$cmd.version"
	done
	echo "${kube_missing[*]}: built in $((SECONDS - start)) s"
fi

