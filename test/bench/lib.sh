# lib.sh — what the bench scripts share. Each sets BENCH_NAME ("bench", "bench xz", ...) and
# sources this file from the repository root (. test/bench/lib.sh) after `set -euo pipefail`.

# log MESSAGE... writes one progress line to standard error.
log() { printf '%s: %s\n' "$BENCH_NAME" "$*" >&2; }

# die MESSAGE... writes an error to standard error and stops the run.
die() {
	printf '%s: error: %s\n' "$BENCH_NAME" "$*" >&2
	exit 1
}

# timed NAME CMD... runs CMD under GNU time ($TIME) with its output in $RUN_DIR/NAME.log and
# sets SECONDS_TAKEN and RSS_KIB; a failure stops the whole run, so it is called directly, never
# in a subshell. GNU time's %e has 10 ms resolution, too coarse for sub-second runs: the wall
# time comes from bash's microsecond clock around it, and only MaxRSS from GNU time.
timed() {
	local name=$1
	shift
	local tf=$RUN_DIR/time.out logf=$RUN_DIR/$name.log start end
	start=$EPOCHREALTIME
	if ! "$TIME" -f '%e %M' -o "$tf" "$@" >"$logf" 2>&1; then
		printf '%s: error: %s failed: %s\n' "$BENCH_NAME" "$name" "$*" >&2
		tail -n 20 "$logf" >&2
		exit 1
	fi
	end=$EPOCHREALTIME
	read -r _ RSS_KIB < <(tail -n 1 "$tf")
	SECONDS_TAKEN=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", e - s }')
}

# resolve_imagectl makes IMAGECTL an absolute path to an executable: unset means the repository's
# bin/imagectl, a bare name is looked up in PATH, a relative path is taken from the caller's
# directory ($CALLER_DIR; the scripts run from $REPO_ROOT).
resolve_imagectl() {
	if [[ -z ${IMAGECTL:-} ]]; then
		IMAGECTL=$REPO_ROOT/bin/imagectl
	elif [[ $IMAGECTL != */* ]]; then
		IMAGECTL=$(command -v "$IMAGECTL") || die "IMAGECTL=$IMAGECTL is not in PATH"
	elif [[ $IMAGECTL != /* ]]; then
		IMAGECTL=$CALLER_DIR/$IMAGECTL
	fi
	[[ -x $IMAGECTL ]] || die "imagectl not found at $IMAGECTL (run 'make build', or set IMAGECTL)"
}
