#!/usr/bin/env bash
# bench.sh — the report behind `make bench`.
#
# Runs `imagectl convert` and `qemu-img convert` side by side, in one run, on the same inputs, and
# prints a Markdown table: median wall time of each, the ratio imagectl/qemu-img next to its
# target, and peak RSS of each. Ratios measured in one run are what to quote; absolute times are
# one machine's. Then runs test/bench/import.sh (imagectl import vs qemu-img convert + tar +
# crane append, against a local distribution registry), test/bench/xz.sh (xz sources: imagectl
# inspect and convert vs xz -dc) and test/bench/syncer.sh (image-syncer: webhook → DataVolume
# latency on two hubs, no-change resync of 5,000 images; about 5 minutes) and appends their tables
# to the report.
#
# Inputs are built once and cached under ${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bench/
# (delete that directory to rebuild them): a sparse 4 GiB ext4 raw image filled from ~1 GB of the
# machine's own files, three qcow2 copies of it made by qemu-img (uncompressed, zlib, zstd), and a
# 64 GiB-virtual sparse raw with a few MiB of scattered random data for the memory ceiling.
#
# Environment:
#   IMAGECTL         imagectl binary (default: bin/imagectl in the repository root; a relative
#                    path given here is taken from the caller's working directory)
#   BENCH_REPS       measured runs per tool and case (default 7 here, 5 in import.sh), after one
#                    warm-up run of each
#   IMAGEPIPE_CACHE  cache root (default $HOME/.cache/imagepipe)
#
# Needs qemu-img, mkfs.ext4 and GNU time (apt-get install qemu-utils e2fsprogs time); import.sh
# also needs skopeo, jq, curl and GNU tar, and the registry and crane from test/buildtools.sh;
# syncer.sh needs go, and etcd, kube-apiserver, the registry and the CRDs from test/buildtools.sh
# (it builds image-syncer itself unless IMAGE_SYNCER names a binary). Last, test/bench/gate.sh
# (image-gate: its time next to an import of the 4 GiB image, layer reads, peak RSS with four
# verifications at once, one layer named by many manifests, a small image among long
# verifications).
# The last report is also written to ${IMAGEPIPE_CACHE}/bench/last.md.
set -euo pipefail

CALLER_DIR=$PWD
cd "$(dirname "$0")/../.."
REPO_ROOT=$PWD

# mkfs.ext4 lives in /usr/sbin, which is not in a normal user's PATH on Debian.
PATH=$PATH:/usr/sbin:/sbin

REPS=${BENCH_REPS:-7}
CACHE=${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}
BENCH_DIR=$CACHE/bench
TIME=/usr/bin/time

RAW_SIZE=4G
BIG_SIZE=64G
# Data set bounds, in bytes of apparent file size.
DATA_MIN=900000000
DATA_MAX=1200000000
# Non-overlapping directories tried in order until the data set reaches DATA_MIN.
DATA_CANDIDATES=(
	/usr/lib/x86_64-linux-gnu
	/usr/local/go
	/usr/share
	/usr/lib/python3
	/usr/include
	/usr/bin
	/usr/libexec
	/usr/lib/gcc
)
RSS_TARGET_MIB=64

BENCH_NAME="bench"
. test/bench/lib.sh

check_tools() {
	local missing=()
	command -v qemu-img >/dev/null || missing+=("qemu-img (apt-get install qemu-utils)")
	command -v mkfs.ext4 >/dev/null || missing+=("mkfs.ext4 (apt-get install e2fsprogs)")
	[[ -x $TIME ]] || missing+=("$TIME (apt-get install time)")
	((BASH_VERSINFO[0] >= 5)) || missing+=("bash 5 or later (for EPOCHREALTIME)")
	if ((${#missing[@]} > 0)); then
		printf 'bench: missing tools:\n' >&2
		printf '  %s\n' "${missing[@]}" >&2
		printf 'install them with: apt-get install qemu-utils e2fsprogs time\n' >&2
		exit 1
	fi
}

# apparent_bytes DIR prints the apparent size of DIR's files, staying on one file system.
apparent_bytes() { du -sbx "$1" 2>/dev/null | cut -f1; }

mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }

# build_raw makes the 4 GiB ext4 image a.raw and dataset.txt describing what went into it.
build_raw() {
	local raw=$BENCH_DIR/a.raw
	[[ -f $raw && -f $BENCH_DIR/dataset.txt ]] && return 0

	local chosen=() total=0 dir size
	for dir in "${DATA_CANDIDATES[@]}"; do
		if ((total >= DATA_MIN)); then break; fi
		[[ -d $dir && ! -L $dir ]] || continue
		size=$(apparent_bytes "$dir")
		[[ -n $size ]] || continue
		((total + size <= DATA_MAX)) || continue
		chosen+=("$dir")
		total=$((total + size))
	done
	((${#chosen[@]} > 0)) || die "none of ${DATA_CANDIDATES[*]} fits in $DATA_MAX bytes"
	((total >= DATA_MIN)) || log "warning: only $(mib "$total") MiB of files found (target 0.9-1.2 GB)"
	log "building $raw from ${chosen[*]} ($(mib "$total") MiB); this takes a few minutes"

	local stage=$BENCH_DIR/stage.tmp list=$BENCH_DIR/files.tmp
	rm -rf "$stage" "$list" "$raw.tmp"
	mkdir -p "$stage"
	# Regular files, directories and symlinks only: no sockets, devices or FIFOs, nothing
	# unreadable, one file system.
	local rel=()
	for dir in "${chosen[@]}"; do rel+=("${dir#/}"); done
	(cd / && find "${rel[@]}" -xdev \( ! -readable -prune \) -o \( -type f -o -type d -o -type l \) -print0) >"$list"
	tar -C / --null --no-recursion -T "$list" -cf - | tar -C "$stage" -xf -
	local copied files
	copied=$(apparent_bytes "$stage")
	files=$(tr -cd '\0' <"$list" | wc -c)

	truncate -s "$RAW_SIZE" "$raw.tmp"
	mkfs.ext4 -q -F -d "$stage" "$raw.tmp" "$RAW_SIZE"
	rm -rf "$stage" "$list"

	{
		printf 'dirs: %s\n' "${chosen[*]}"
		printf 'bytes: %s\n' "$copied"
		printf 'entries: %s\n' "$files"
	} >"$BENCH_DIR/dataset.txt"
	mv "$raw.tmp" "$raw"
}

# derive OUT ARGS... makes OUT from a.raw with `qemu-img convert ARGS`, once.
derive() {
	local out=$1
	shift
	[[ -f $out ]] && return 0
	log "deriving $(basename "$out")"
	qemu-img convert "$@" "$BENCH_DIR/a.raw" "$out.tmp"
	mv "$out.tmp" "$out"
}

# build_big makes the 64 GiB-virtual sparse raw with 32 x 128 KiB of random data at scattered
# offsets (4 MiB in all).
build_big() {
	local big=$BENCH_DIR/e-64g.raw
	[[ -f $big ]] && return 0
	log "building $(basename "$big")"
	rm -f "$big.tmp"
	truncate -s "$BIG_SIZE" "$big.tmp"
	local i off
	for ((i = 0; i < 32; i++)); do
		# Spread over the whole disk, off cluster boundaries, the last chunk near the end.
		off=$((i * 2047 * 1024 * 1024 + i * 4096 * 3))
		dd if=/dev/urandom of="$big.tmp" bs=128K count=1 seek="$off" oflag=seek_bytes conv=notrunc status=none
	done
	mv "$big.tmp" "$big"
}

fresh_out() {
	rm -rf "$OUT_DIR"
	mkdir -p "$OUT_DIR"
	sync
}

# verify IN IN_FMT OUT OUT_FMT checks imagectl's output against its input with qemu-img.
verify() {
	local in=$1 in_fmt=$2 out=$3 out_fmt=$4
	if [[ $out_fmt == qcow2 ]] && ! qemu-img check -q -f qcow2 "$out"; then
		die "qemu-img check: imagectl's output $out is not a valid qcow2"
	fi
	if ! qemu-img compare -q -f "$in_fmt" -F "$out_fmt" "$in" "$out"; then
		die "qemu-img compare: imagectl's output $out differs from $in"
	fi
	log "verified imagectl output ($out_fmt) against $(basename "$in")"
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
maximum() { printf '%s\n' "$@" | sort -g | tail -n 1; }

ROWS=()
COMMANDS=()
SECONDS_TAKEN=
RSS_KIB=

# run_case LABEL IN IN_FMT TO TARGET_RATIO
run_case() {
	local label=$1 in=$2 in_fmt=$3 to=$4 target=$5
	local out=$OUT_DIR/out.$to
	local ictl=("$IMAGECTL" convert "$in" "$out" --to "$to")
	local qimg=(qemu-img convert -O "$to" "$in" "$out")
	COMMANDS+=("$label: \`${ictl[*]}\`" "$label: \`${qimg[*]}\`")
	log "case $label: warm-up"

	fresh_out
	timed imagectl "${ictl[@]}"
	fresh_out
	timed qemu-img "${qimg[@]}"

	local it=() ir=() qt=() qr=() rep tool order
	for ((rep = 1; rep <= REPS; rep++)); do
		log "case $label: rep $rep/$REPS"
		# Alternate which tool goes first, so neither always follows the other's writeback.
		if ((rep % 2)); then order="imagectl qemu-img"; else order="qemu-img imagectl"; fi
		for tool in $order; do
			fresh_out
			if [[ $tool == imagectl ]]; then
				timed imagectl "${ictl[@]}"
				it+=("$SECONDS_TAKEN") ir+=("$RSS_KIB")
				if ((rep == 1)); then verify "$in" "$in_fmt" "$out" "$to"; fi
			else
				timed qemu-img "${qimg[@]}"
				qt+=("$SECONDS_TAKEN") qr+=("$RSS_KIB")
			fi
		done
	done
	rm -rf "$OUT_DIR"

	local imed qmed imax qmax ratio met
	imed=$(median "${it[@]}")
	qmed=$(median "${qt[@]}")
	imax=$(maximum "${ir[@]}")
	qmax=$(maximum "${qr[@]}")
	if [[ -n $target ]]; then
		ratio=$(awk -v a="$imed" -v b="$qmed" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
		met=$(awk -v r="$ratio" -v t="$target" 'BEGIN { if (r == "n/a") print "n/a"; else if (r + 0 <= t + 0) print "yes"; else print "no" }')
		target="≤ ${target}×"
		[[ $ratio == n/a ]] || ratio="${ratio}×"
	else
		ratio=$(awk -v a="$imed" -v b="$qmed" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else print "n/a" }')
		target="MaxRSS < ${RSS_TARGET_MIB} MiB"
		met=$(awk -v k="$imax" -v t="$RSS_TARGET_MIB" 'BEGIN { print (k / 1024 < t) ? "yes" : "no" }')
	fi
	ROWS+=("| $label | $imed | $qmed | $ratio | $target | $met | $(awk -v k="$imax" 'BEGIN { printf "%.1f", k / 1024 }') | $(awk -v k="$qmax" 'BEGIN { printf "%.1f", k / 1024 }') |")
}

main() {
	if [[ ${1:-} == --raw ]]; then # build (or find) the 4 GiB ext4 image only, for gate.sh
		check_tools
		mkdir -p "$BENCH_DIR"
		build_raw
		return 0
	fi
	check_tools
	resolve_imagectl
	[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPS must be a positive integer, got '$REPS'"
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/import.sh" --check
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/xz.sh" --check
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/syncer.sh" --check
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/gate.sh" --check

	mkdir -p "$BENCH_DIR"
	build_raw
	derive "$BENCH_DIR/b.qcow2" -O qcow2
	derive "$BENCH_DIR/c-zlib.qcow2" -c -O qcow2 -o compression_type=zlib
	derive "$BENCH_DIR/d-zstd.qcow2" -c -O qcow2 -o compression_type=zstd
	build_big

	RUN_DIR=$(mktemp -d "$BENCH_DIR/run.XXXXXX")
	OUT_DIR=$RUN_DIR/out
	trap 'rm -rf "$RUN_DIR"' EXIT

	run_case "(a) sparse raw → qcow2" "$BENCH_DIR/a.raw" raw qcow2 1.0
	run_case "(b) qcow2 → raw" "$BENCH_DIR/b.qcow2" qcow2 raw 1.0
	run_case "(c) zlib qcow2 → qcow2" "$BENCH_DIR/c-zlib.qcow2" qcow2 qcow2 1.5
	run_case "(d) zstd qcow2 → qcow2" "$BENCH_DIR/d-zstd.qcow2" qcow2 qcow2 1.5
	run_case "(e) 64 GiB sparse raw → qcow2" "$BENCH_DIR/e-64g.raw" raw qcow2 ""

	local dirs bytes entries alloc f
	dirs=$(sed -n 's/^dirs: //p' "$BENCH_DIR/dataset.txt")
	bytes=$(sed -n 's/^bytes: //p' "$BENCH_DIR/dataset.txt")
	entries=$(sed -n 's/^entries: //p' "$BENCH_DIR/dataset.txt")
	alloc=$(du -B1 "$BENCH_DIR/a.raw" | cut -f1)

	local report=$BENCH_DIR/last.md
	{
		printf '# imagepipe bench: imagectl vs qemu-img\n\n'
		printf -- '- date: %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
		printf -- '- cpus: %s × %s\n' "$(nproc)" "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
		printf -- '- memory: %s MiB\n' "$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1024 }' /proc/meminfo)"
		printf -- '- %s\n' "$(qemu-img --version | head -n 1)"
		printf -- '- %s\n' "$(go version 2>/dev/null || echo 'go: not found')"
		printf -- '- imagectl: %s\n' "$IMAGECTL"
		printf -- '- data set: %s MiB in %s entries from %s, in a %s ext4 raw image (%s MiB allocated)\n' \
			"$(mib "$bytes")" "$entries" "$dirs" "$RAW_SIZE" "$(mib "$alloc")"
		printf -- '- inputs (cached in %s):' "$BENCH_DIR"
		local sizes=()
		for f in a.raw b.qcow2 c-zlib.qcow2 d-zstd.qcow2 e-64g.raw; do
			sizes+=("$f $(mib "$(du -B1 "$BENCH_DIR/$f" | cut -f1)") MiB allocated")
		done
		(
			IFS=';'
			printf ' %s\n' "${sizes[*]}" | sed 's/;/; /g'
		)
		# shellcheck disable=SC2016 # backticks are Markdown here
		printf -- '- method: per case one unmeasured warm-up run of each tool (page cache warm for both), then %s measured runs of each, alternating which tool goes first; wall time is the median, MaxRSS the largest of the measured runs (`/usr/bin/time -v` MaxRSS); every run writes a fresh output in an emptied directory, with `sync` between runs outside the timing; neither tool flushes its output to disk before exiting (qemu-img convert by default, imagectl without --sync), so both leave writeback to the kernel; imagectl output of the first measured run checked with `qemu-img compare` (and `qemu-img check` for qcow2)\n\n' "$REPS"
		printf '| case | imagectl wall (s) | qemu-img wall (s) | ratio imagectl/qemu-img | target | met | imagectl MaxRSS (MiB) | qemu-img MaxRSS (MiB) |\n'
		printf '|---|---:|---:|---:|---|---|---:|---:|\n'
		printf '%s\n' "${ROWS[@]}"
		printf '\nCommands (INPUT and OUTPUT paths as run; qemu-img with its defaults):\n\n'
		printf -- '- %s\n' "${COMMANDS[@]}"
	} >"$report"
	cat "$report"

	# The import benchmark (imagectl import vs qemu-img convert + tar + crane append to a local
	# registry) runs last; its section is appended to the same report.
	local import_md=$RUN_DIR/import.md
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/import.sh" >"$import_md"
	cat "$import_md" >>"$report"
	cat "$import_md"

	# xz sources (its own input, built once and cached).
	local xz_md=$RUN_DIR/xz.md
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/xz.sh" >"$xz_md"
	cat "$xz_md" >>"$report"
	cat "$xz_md"

	# The image-syncer benchmark (real hubs, registry and syncer; no inputs from above) last.
	local syncer_md=$RUN_DIR/syncer.md
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/syncer.sh" >"$syncer_md"
	cat "$syncer_md" >>"$report"
	cat "$syncer_md"

	# image-gate on the 4 GiB image built above.
	local gate_md=$RUN_DIR/gate.md
	IMAGECTL=$IMAGECTL IMAGEPIPE_CACHE=$CACHE bash "$REPO_ROOT/test/bench/gate.sh" >"$gate_md"
	cat "$gate_md" >>"$report"
	cat "$gate_md"
	log "report written to $report"
}

main "$@"
