#!/usr/bin/env bash
# gate.sh — the image-gate part of `make bench` (bench.sh runs it last and appends its section to
# the report). It can also be run alone; `gate.sh --check` only checks what it needs.
#
# Runs the Go benchmark in test/bench/gate (`go test -bench Gate -benchtime 1x`) against the CNCF
# distribution registry and the image-gate binary. Disk, on the 4 GiB ext4 bench image of bench.sh
# (built when missing): imagectl import, then the gate's own time to verify, publish and sign,
# three times with gzip layers and three with zstd (target: the gate at most 0.25 of the import); the gate's full reads of the
# tenant's layer per digest (target 1); one push to Ready on two hubs with image-syncer and CDI's
# real controller and importer; its peak memory with four verifications at once (target 256 MiB).
# ReadOnce: a zstd layer of run-length blocks declaring an 8 GiB raw disk, under three manifests
# and an index of 8 platforms: the gate's CPU time and reads of the layer per step (target: none
# after the first, at most 0.05 of its CPU). Waiting: a 4 MiB image's push to verdict, alone and
# while two other tenants' four 16 GiB verifications run (target 5 s). BootCheck: the boot check's
# time and QEMU's peak memory on the guests test/guests.sh builds (target: the Debian guest in
# about a minute).
# About 10 minutes on 2 cores; ReadOnce spools 8 GiB in the gate's temp folder. The Markdown
# section goes to standard output. One part alone, without the bench image:
#   go test ./test/bench/gate -run '^$' -bench 'Gate/ReadOnce' -benchtime 1x -v
#
# Environment:
#   IMAGECTL         imagectl binary (default: bin/imagectl in the repository root)
#   IMAGE_GATE       image-gate binary (default: the test builds one from the working tree)
#   IMAGE_SYNCER     image-syncer binary (the same)
#   IMAGEPIPE_CACHE  cache root (default $HOME/.cache/imagepipe)
set -euo pipefail

CALLER_DIR=$PWD
cd "$(dirname "$0")/../.."
REPO_ROOT=$PWD
CACHE=${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}
TOOLS_BIN=${IMAGEPIPE_BIN:-$CACHE/bin}

BENCH_NAME="bench gate"
OUT= # the section, from go test
. test/bench/lib.sh

abs() { [[ $1 == /* ]] && printf '%s\n' "$1" || printf '%s\n' "$CALLER_DIR/$1"; }

main() {
	command -v go >/dev/null || die "go is not in PATH"
	for tool in registry etcd kube-apiserver cdi-controller cdi-importer; do
		[[ -x $TOOLS_BIN/$tool ]] || die "$tool is not built in $TOOLS_BIN: run make tools"
	done
	IMAGECTL=$(abs "${IMAGECTL:-$REPO_ROOT/bin/imagectl}")
	[[ -x $IMAGECTL ]] || die "imagectl not found at $IMAGECTL (run 'make build', or set IMAGECTL)"
	command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is not installed: run make tools"
	guests=$(IMAGEPIPE_CACHE=$CACHE bash test/guests.sh --dir)
	[[ -f $guests/versions ]] || die "the test guests are not built in $guests: run make tools"
	[[ ${1:-} != --check ]] || return 0

	IMAGEPIPE_CACHE=$CACHE bash test/bench/bench.sh --raw >&2
	OUT=$(mktemp)
	trap 'rm -f "$OUT"' EXIT
	log "running test/bench/gate (about 10 minutes)"
	if ! IMAGEPIPE_BENCH_OUT=$OUT IMAGEPIPE_BENCH_DISK=$CACHE/bench/a.raw IMAGECTL=$IMAGECTL \
		IMAGE_GATE=${IMAGE_GATE:+$(abs "$IMAGE_GATE")} IMAGE_SYNCER=${IMAGE_SYNCER:+$(abs "$IMAGE_SYNCER")} \
		IMAGEPIPE_CACHE=$CACHE IMAGEPIPE_BIN=$TOOLS_BIN \
		go test ./test/bench/gate -run '^$' -bench '^BenchmarkGate$' -benchtime 1x -count=1 -v -timeout 45m >&2; then
		die "go test ./test/bench/gate failed (its log is above)"
	fi
	[[ -s $OUT ]] || die "test/bench/gate wrote no report (its log is above)"
	cat "$OUT"
}

main "$@"
