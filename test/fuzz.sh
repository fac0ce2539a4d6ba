#!/usr/bin/env bash
# Runs each fuzz target (package:Target) for FUZZTIME. Go's fuzzer sometimes
# ends a healthy run with "context deadline exceeded" when the time runs out
# while a worker is busy; such a run, with no failing input, is tried once
# more. A real crash ("Failing input written to ...") fails at once. A
# target that skips (a tool make tools builds is missing) fails too: under
# -fuzz, go test reports a skip as a pass unless -v shows it.
set -uo pipefail
fuzztime=${FUZZTIME:-10s}
# Go minimises each new interesting input for up to a minute by default,
# which in a 10-second run leaves no time to fuzz; a thousand tries still
# shrink an input in milliseconds.
minimize=${FUZZMINIMIZETIME:-1000x}
for t in "$@"; do
	pkg=${t%%:*}
	name=${t##*:}
	for attempt in 1 2; do
		echo "fuzz $name for $fuzztime"
		out=$(go test -v -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$pkg" 2>&1)
		rc=$?
		printf '%s\n' "$out" | grep '^fuzz: elapsed' | tail -n 1
		printf '%s\n' "$out" | tail -n 1
		if grep -q -- "--- SKIP: ${name} " <<<"$out"; then
			printf '%s\n' "$out" | grep -B 1 -- "--- SKIP: ${name} "
			echo "fuzz $name: skipped; it must run"
			exit 1
		fi
		if [ $rc -eq 0 ]; then
			break
		fi
		if [ $attempt -eq 1 ] && grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input' <<<"$out"; then
			echo "fuzz $name: the fuzzer timed out without a failing input; trying again"
			continue
		fi
		printf '%s\n' "$out"
		exit 1
	done
done
