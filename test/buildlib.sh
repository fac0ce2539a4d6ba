# buildlib.sh — what test/buildtools.sh and test/buildkube.sh share: the
# folder the tools go to, a throwaway work folder removed on exit, and two
# helpers. Sourced, not run.

bin="${IMAGEPIPE_BIN:-${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/bin}"
mkdir -p "$bin"

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
