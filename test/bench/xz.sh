#!/usr/bin/env bash
# xz.sh — the xz source part of `make bench` (bench.sh runs it and appends its table to the
# report). It can also be run alone; `xz.sh --check` only checks the tools it needs.
#
# Measures how fast imagectl reads an xz-compressed source against xz itself, in one run, on one
# input: a 1 GiB raw disk whose first 256 MiB are the machine's own files (libraries and programs,
# which compress like a real disk's data) and whose rest is zeros, compressed with `xz -T1 -6`
# (one block, so neither side can decode it on several threads). Cases, each against its peer:
#
#   xz source, read through    imagectl inspect IN              vs  xz -dc IN > /dev/null
#   xz source, to a raw file   imagectl convert IN OUT --to raw vs  xz -dc IN > OUT (sparse)
#   the floor (reference)      xz -dc IN > FILE on tmpfs        vs  xz -dc IN > /dev/null
#   the same, pure-Go decoder  imagectl inspect IN, with no xz in PATH (for reference)
#
# imagectl decodes xz with the system's xz program when it is in PATH (internal/source), and
# with the pure-Go decoder otherwise. xz reads the local file itself, and writes the decompressed
# image straight into a sparse temporary file (convert), or into a memory file that imagectl
# reads and frees just behind it (inspect, which writes nothing to disk).
#
# The input is built once and cached under $IMAGEPIPE_CACHE/bench (xz-1g.raw.xz). The Markdown
# section is written to standard output; progress goes to standard error.
#
# Environment:
#   IMAGECTL         imagectl binary (default: bin/imagectl in the repository root)
#   BENCH_REPS       measured runs per tool and case (default 5), after one warm-up run of each
#   IMAGEPIPE_CACHE  cache root (default $HOME/.cache/imagepipe)
#
# Needs xz (xz-utils), GNU time and bash 5.
set -euo pipefail

CALLER_DIR=$PWD
cd "$(dirname "$0")/../.."
REPO_ROOT=$PWD

REPS=${BENCH_REPS:-5}
CACHE=${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}
BENCH_DIR=$CACHE/bench
TIME=/usr/bin/time
INPUT=$BENCH_DIR/xz-1g.raw.xz
DATA_DIRS=(/usr/lib/x86_64-linux-gnu /usr/lib /usr/bin /usr/share)
# imagectl / xz -dc, wall time: "no slower than xz -dc".
TARGET=1.0

BENCH_NAME="bench xz"
. test/bench/lib.sh

check_tools() {
	local missing=()
	command -v xz >/dev/null || missing+=("xz (apt-get install xz-utils)")
	[[ -x $TIME ]] || missing+=("$TIME (apt-get install time)")
	((BASH_VERSINFO[0] >= 5)) || missing+=("bash 5 or later (for EPOCHREALTIME)")
	if ((${#missing[@]} > 0)); then
		printf 'bench xz: missing tools:\n' >&2
		printf '  %s\n' "${missing[@]}" >&2
		exit 1
	fi
	XZ=$(command -v xz)
}

# build_input makes the 1 GiB disk and its xz file, once.
build_input() {
	[[ -f $INPUT ]] && return 0
	mkdir -p "$BENCH_DIR"
	local raw=$BENCH_DIR/xz-1g.raw.tmp
	log "building $(basename "$INPUT") (256 MiB of files, then zeros, xz -T1 -6); a few minutes"
	rm -f "$raw" "$INPUT.tmp"
	truncate -s 1G "$raw"
	# Regular files in a fixed order, so that every run builds the same disk.
	local dirs=()
	for d in "${DATA_DIRS[@]}"; do [[ -d $d ]] && dirs+=("$d"); done
	{ find "${dirs[@]}" -xdev -type f -size +4k -readable -print0 2>/dev/null | sort -z |
		xargs -0 cat 2>/dev/null || true; } | head -c 256M | dd of="$raw" conv=notrunc status=none
	xz -T1 -6 -c "$raw" >"$INPUT.tmp"
	rm -f "$raw"
	mv "$INPUT.tmp" "$INPUT"
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
maximum() { printf '%s\n' "$@" | sort -g | tail -n 1; }

ROWS=()
COMMANDS=()

# run_case LABEL TARGET PEER_TEXT OURS_CMD -- PEER_CMD: one warm-up of each, then REPS measured
# runs of each, alternating which goes first; OUT (if any) is removed before every run. PEER_TEXT
# is how the report shows PEER_CMD.
run_case() {
	local label=$1 target=$2 peer_text=$3
	shift 3
	local ours=() peer=()
	while [[ $1 != -- ]]; do
		ours+=("$1")
		shift
	done
	shift
	peer=("$@")
	COMMANDS+=("$label: \`${ours[*]}\`" "$label, peer: \`$peer_text\`")
	log "case $label: warm-up"
	rm -f "$OUT"
	timed ours "${ours[@]}"
	rm -f "$OUT"
	timed peer "${peer[@]}"
	local ot=() orss=() pt=() prss=() rep tool order
	for ((rep = 1; rep <= REPS; rep++)); do
		log "case $label: rep $rep/$REPS"
		if ((rep % 2)); then order="ours peer"; else order="peer ours"; fi
		for tool in $order; do
			rm -f "$OUT"
			sync
			if [[ $tool == ours ]]; then
				timed ours "${ours[@]}"
				ot+=("$SECONDS_TAKEN") orss+=("$RSS_KIB")
			else
				timed peer "${peer[@]}"
				pt+=("$SECONDS_TAKEN") prss+=("$RSS_KIB")
			fi
		done
	done
	rm -f "$OUT"
	local omed pmed ratio met pairs=() i spread
	omed=$(median "${ot[@]}")
	pmed=$(median "${pt[@]}")
	# Each rep runs both tools back to back; the ratio within a rep is
	# spared the host's slower and faster minutes, which move both alike.
	for i in "${!ot[@]}"; do
		pairs+=("$(awk -v a="${ot[$i]}" -v b="${pt[$i]}" 'BEGIN { if (b > 0) printf "%.4f", a / b; else print 0 }')")
	done
	ratio=$(printf '%.2f' "$(median "${pairs[@]}")")
	spread=$(printf '%s\n' "${pairs[@]}" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f–%.2f", lo, hi }')
	if [[ -n $target ]]; then
		met=$(awk -v r="$ratio" -v t="$target" 'BEGIN { if (r == "n/a") print "n/a"; else if (r + 0 <= t + 0) print "yes"; else print "no" }')
		target="≤ ${target}×"
	else
		met="—" target="(reference)"
	fi
	ROWS+=("| $label | $omed | $pmed | ${ratio}× | $spread | $target | $met | $(awk -v k="$(maximum "${orss[@]}")" 'BEGIN { printf "%.1f", k / 1024 }') | $(awk -v k="$(maximum "${prss[@]}")" 'BEGIN { printf "%.1f", k / 1024 }') |")
}

main() {
	check_tools
	[[ ${1:-} != --check ]] || return 0
	resolve_imagectl
	[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPS must be a positive integer, got '$REPS'"
	build_input

	RUN_DIR=$(mktemp -d "$BENCH_DIR/xzrun.XXXXXX")
	OUT=$RUN_DIR/out.raw
	trap 'rm -rf "$RUN_DIR"' EXIT
	# A PATH without xz, for imagectl's pure-Go decoder.
	mkdir -p "$RUN_DIR/nopath"

	run_case "xz source: imagectl inspect vs xz -dc" "$TARGET" "$XZ -dc $INPUT > /dev/null" \
		"$IMAGECTL" inspect "$INPUT" -- sh -c '"$0" -dc "$1" >/dev/null' "$XZ" "$INPUT"
	# The floor for any program that must see the decoded bytes: xz itself writing them to memory
	# (a tmpfs file, as inspect's memory file) instead of discarding them. Skipped without a tmpfs
	# at /dev/shm with room for the image.
	if [[ $(stat -f -c %T /dev/shm 2>/dev/null) == tmpfs ]] &&
		(($(df -P -B1 /dev/shm | awk 'NR == 2 { print $4 }') > 2 * 1024 * 1024 * 1024)); then
		SHM_OUT=$(mktemp /dev/shm/imagepipe-xzbench.XXXXXX)
		trap 'rm -rf "$RUN_DIR" "$SHM_OUT"' EXIT
		run_case "reference, no imagectl: xz -dc > tmpfs file vs xz -dc > /dev/null" "" "$XZ -dc $INPUT > /dev/null" \
			sh -c '"$0" -dc "$1" >"$2"' "$XZ" "$INPUT" "$SHM_OUT" -- sh -c '"$0" -dc "$1" >/dev/null' "$XZ" "$INPUT"
		rm -f "$SHM_OUT"
	fi
	run_case "xz source: imagectl convert --to raw vs xz -dc > file" "$TARGET" "$XZ -dc $INPUT > $OUT" \
		"$IMAGECTL" convert --quiet "$INPUT" "$OUT" --to raw -- sh -c '"$0" -dc "$1" >"$2"' "$XZ" "$INPUT" "$OUT"
	run_case "xz source, pure-Go decoder: imagectl inspect vs xz -dc" "" "$XZ -dc $INPUT > /dev/null" \
		env PATH="$RUN_DIR/nopath" "$IMAGECTL" inspect "$INPUT" -- sh -c '"$0" -dc "$1" >/dev/null' "$XZ" "$INPUT"

	printf '\n## xz sources: imagectl vs xz -dc\n\n'
	printf -- '- %s\n' "$(xz --version | head -n 1)"
	printf -- '- input: %s, %s MiB, a 1 GiB raw disk (256 MiB of files from %s, then zeros), xz -T1 -6\n' \
		"$INPUT" "$(awk -v b="$(stat -c %s "$INPUT")" 'BEGIN { printf "%.0f", b / 1048576 }')" "${DATA_DIRS[*]}"
	# shellcheck disable=SC2016 # backticks are Markdown here
	printf -- '- method: one unmeasured warm-up run of each, then %s measured runs of each, alternating which goes first; wall time is the median; the ratio is the median of the %s per-run ratios (each run of imagectl against the run of the peer next to it), and the range their lowest and highest; `sync` between runs outside the timing; imagectl uses the xz program in PATH unless the row says otherwise\n\n' "$REPS" "$REPS"
	printf '| case | imagectl wall (s) | peer wall (s) | ratio imagectl/peer | ratio range | target | met | imagectl MaxRSS (MiB) | peer MaxRSS (MiB) |\n'
	printf '|---|---:|---:|---:|---:|---|---|---:|---:|\n'
	printf '%s\n' "${ROWS[@]}"
	printf '\nCommands:\n\n'
	printf -- '- %s\n' "${COMMANDS[@]}"
}

main "$@"
