#!/usr/bin/env bash
# syncer.sh — the image-syncer part of `make bench` (bench.sh runs it after import.sh and appends
# its section to the report). It can also be run alone; `syncer.sh --check` only checks (and
# builds) what it needs.
#
# Runs the Go benchmark in test/bench/syncer (`go test` with IMAGEPIPE_BENCH=1) against real hubs
# (etcd + kube-apiserver with the CDI, KubeVirt and BaseImage CRDs), the CNCF distribution
# registry and the image-syncer binary:
#
#   latency: two hubs, one syncer each, the registry notifying both; 200 pushes with
#     imagectl import; registry manifest PUT → DataVolume ADDED on each hub, p50/p99/max
#     (target p99 ≤ 1 s)
#   resync:  one hub, 5,000 tags in 100 repositories; after the initial sync settled, 15 fast
#     polls: registry requests per repository (target ≤ 1), Kubernetes writes (target 0),
#     the syncer's RSS
#
# About 5½ minutes on 2 cores, 3½ of them the syncer's initial sync of the 5,000 images. The
# Markdown section is written to standard output; go test's log goes to standard error.
#
# Environment:
#   IMAGECTL              imagectl binary (default: bin/imagectl in the repository root)
#   IMAGE_SYNCER          image-syncer binary (default: the test builds one from the working tree)
#   IMAGEPIPE_CACHE       cache root (default $HOME/.cache/imagepipe): etcd, kube-apiserver and the
#                         registry in ${IMAGEPIPE_BIN:-$IMAGEPIPE_CACHE/bin}, the CRDs in
#                         $IMAGEPIPE_CACHE/crds (built by test/buildtools.sh when missing)
#   IMAGEPIPE_BENCH_LOGS  a directory to keep the registry's and syncers' logs and a per-push CSV in
set -euo pipefail

CALLER_DIR=$PWD
cd "$(dirname "$0")/../.."
REPO_ROOT=$PWD

CACHE=${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}
TOOLS_BIN=${IMAGEPIPE_BIN:-$CACHE/bin}
OUT= # the section, from go test

BENCH_NAME="bench syncer"
. test/bench/lib.sh

resolve() { # resolve VALUE: a command name from PATH, a relative path from the caller's directory
	if [[ $1 != */* ]]; then
		command -v "$1" || die "$1 is not in PATH"
	elif [[ $1 != /* ]]; then
		printf '%s\n' "$CALLER_DIR/$1"
	else
		printf '%s\n' "$1"
	fi
}

check_tools() {
	command -v go >/dev/null || die "go is not in PATH"
	local missing=0 tool
	for tool in etcd kube-apiserver registry; do
		[[ -x $TOOLS_BIN/$tool ]] || missing=1
	done
	for tool in cdi kubevirt instancetype; do
		[[ -d $CACHE/crds/$tool ]] || missing=1
	done
	if ((missing)); then
		log "etcd, kube-apiserver, the registry or the CRDs are missing: running test/buildtools.sh"
		IMAGEPIPE_CACHE=$CACHE IMAGEPIPE_BIN=$TOOLS_BIN bash "$REPO_ROOT/test/buildtools.sh" >&2
	fi
	IMAGECTL=$(resolve "${IMAGECTL:-$REPO_ROOT/bin/imagectl}")
	[[ -x $IMAGECTL ]] || die "imagectl not found at $IMAGECTL (run 'make build', or set IMAGECTL)"
	if [[ -n ${IMAGE_SYNCER:-} ]]; then
		IMAGE_SYNCER=$(resolve "$IMAGE_SYNCER")
		[[ -x $IMAGE_SYNCER ]] || die "IMAGE_SYNCER=$IMAGE_SYNCER is not an executable"
	fi
}

main() {
	check_tools
	[[ ${1:-} != --check ]] || return 0

	OUT=$(mktemp)
	trap 'rm -f "$OUT"' EXIT
	log "running test/bench/syncer (about 5 minutes)"
	# IMAGEPIPE_BENCH_OUT receives the section only when the whole benchmark ran: a skip (a
	# missing tool) or a failure leaves it empty.
	if ! IMAGEPIPE_BENCH=1 IMAGEPIPE_BENCH_OUT=$OUT IMAGECTL=$IMAGECTL IMAGE_SYNCER=${IMAGE_SYNCER:-} \
		IMAGEPIPE_CACHE=$CACHE IMAGEPIPE_BIN=$TOOLS_BIN \
		go test ./test/bench/syncer -run 'TestSyncerBench' -count=1 -v -timeout 30m >&2; then
		die "go test ./test/bench/syncer failed (its log is above)"
	fi
	[[ -s $OUT ]] || die "test/bench/syncer wrote no report: was TestSyncerBench skipped? (its log is above)"
	cat "$OUT"
}

main "$@"
