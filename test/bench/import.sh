#!/usr/bin/env bash
# import.sh — the import part of `make bench` (bench.sh runs it last and appends its table to the
# report). It can also be run alone once bench.sh has built the inputs; `import.sh --check` only
# checks (and builds) the tools it needs.
#
# Compares `imagectl import` with the pipeline KubeVirt's docs and the containerdisks project use
# to publish a containerDisk, in one run, against one local CNCF distribution registry, on the
# inputs bench.sh builds (a.raw, the sparse 4 GiB ext4 image, and c-zlib.qcow2, its zlib-compressed
# qcow2):
#
#   peer pipeline, timed as one unit:
#     qemu-img convert -O qcow2 SOURCE W/disk/disk.img
#     chmod 0444 W/disk/disk.img; chmod 0555 W/disk
#     tar --owner=107 --group=107 --numeric-owner -C W -cf W/layer.tar disk
#     crane append -f W/layer.tar -t 127.0.0.1:PORT/acme/peer-N:1 --insecure
#   imagectl:
#     imagectl import SOURCE 127.0.0.1:PORT/acme/ours-N:1 --quiet
#
# Every run pushes to a fresh repository, so nothing is deduplicated. The Markdown section is
# written to standard output; progress goes to standard error.
#
# Environment:
#   IMAGECTL         imagectl binary (default: bin/imagectl in the repository root)
#   BENCH_REPS       measured runs per tool and case (default 5), after one warm-up run of each
#   IMAGEPIPE_CACHE  cache root (default $HOME/.cache/imagepipe); inputs in $IMAGEPIPE_CACHE/bench,
#                    registry and crane in ${IMAGEPIPE_BIN:-$IMAGEPIPE_CACHE/bin} (built by
#                    test/buildtools.sh when missing)
#
# Needs qemu-img, skopeo, GNU tar, GNU time, jq and curl.
set -euo pipefail

CALLER_DIR=$PWD
cd "$(dirname "$0")/../.."
REPO_ROOT=$PWD

REPS=${BENCH_REPS:-5}
CACHE=${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}
BENCH_DIR=$CACHE/bench
TOOLS_BIN=${IMAGEPIPE_BIN:-$CACHE/bin}
# imagectl's digest cache and upload state live here too.
export IMAGEPIPE_CACHE=$CACHE
TIME=/usr/bin/time
RAW=$BENCH_DIR/a.raw
ZLIB=$BENCH_DIR/c-zlib.qcow2

# Targets: imagectl wall / peer pipeline wall, and the re-import's wall time in seconds.
TARGET_RAW=0.15
TARGET_ZLIB=0.5
TARGET_REIMPORT_S=1

BENCH_NAME="bench import"
. test/bench/lib.sh

check_tools() {
	local missing=()
	command -v qemu-img >/dev/null || missing+=("qemu-img (apt-get install qemu-utils)")
	command -v skopeo >/dev/null || missing+=("skopeo (apt-get install skopeo)")
	command -v jq >/dev/null || missing+=("jq (apt-get install jq)")
	command -v curl >/dev/null || missing+=("curl (apt-get install curl)")
	tar --version 2>/dev/null | grep -q 'GNU tar' || missing+=("GNU tar (apt-get install tar)")
	[[ -x $TIME ]] || missing+=("$TIME (apt-get install time)")
	((BASH_VERSINFO[0] >= 5)) || missing+=("bash 5 or later (for EPOCHREALTIME)")
	if ((${#missing[@]} > 0)); then
		printf 'bench import: missing tools:\n' >&2
		printf '  %s\n' "${missing[@]}" >&2
		exit 1
	fi
	if [[ ! -x $TOOLS_BIN/registry || ! -x $TOOLS_BIN/crane ]]; then
		log "registry or crane missing in $TOOLS_BIN: running test/buildtools.sh"
		IMAGEPIPE_BIN=$TOOLS_BIN bash "$REPO_ROOT/test/buildtools.sh" >&2
	fi
	REGISTRY=$TOOLS_BIN/registry
	CRANE=$TOOLS_BIN/crane
}

check_inputs() {
	[[ -f $RAW && -f $ZLIB ]] || die "inputs $RAW and $ZLIB are missing: run 'make bench' (bench.sh builds them)"
}

REGISTRY_PID=
RUN_DIR=

cleanup() {
	local rc=$?
	if [[ -n $REGISTRY_PID ]]; then
		kill "$REGISTRY_PID" 2>/dev/null || true
		wait "$REGISTRY_PID" 2>/dev/null || true
		REGISTRY_PID=
	fi
	if [[ -n $RUN_DIR && -d $RUN_DIR ]]; then
		# The peer pipeline leaves read-only directories behind.
		chmod -R u+w "$RUN_DIR" 2>/dev/null || true
		rm -rf "$RUN_DIR"
	fi
	exit "$rc"
}

# port_free PORT succeeds when nothing listens on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_registry runs the distribution registry on a free port with its storage in RUN_DIR and
# sets PORT and HOSTPORT once it answers /v2/.
start_registry() {
	local attempt i
	for ((attempt = 1; attempt <= 5; attempt++)); do
		PORT=$((20000 + RANDOM % 40000))
		port_free "$PORT" || continue
		HOSTPORT=127.0.0.1:$PORT
		cat >"$RUN_DIR/registry.yml" <<-EOF
			version: 0.1
			log:
			  level: warn
			storage:
			  filesystem:
			    rootdirectory: $RUN_DIR/registry
			  delete:
			    enabled: true
			http:
			  addr: $HOSTPORT
			  secret: $(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
		EOF
		# No tracing exporter: the default one would try to reach a collector on localhost.
		OTEL_TRACES_EXPORTER=none "$REGISTRY" serve "$RUN_DIR/registry.yml" >>"$RUN_DIR/registry.log" 2>&1 &
		REGISTRY_PID=$!
		for ((i = 0; i < 300; i++)); do
			if ! kill -0 "$REGISTRY_PID" 2>/dev/null; then
				wait "$REGISTRY_PID" 2>/dev/null || true
				REGISTRY_PID=
				break # exited, probably the port was taken meanwhile: another port
			fi
			if curl -fsS -o /dev/null "http://$HOSTPORT/v2/" 2>/dev/null; then
				log "registry $("$REGISTRY" --version 2>/dev/null | head -n 1) on $HOSTPORT, storage $RUN_DIR/registry"
				return 0
			fi
			sleep 0.1
		done
		[[ -z $REGISTRY_PID ]] || die "the registry did not answer on $HOSTPORT within 30 s (log: $RUN_DIR/registry.log)"
	done
	tail -n 20 "$RUN_DIR/registry.log" >&2 || true
	die "could not start the registry"
}

# timed NAME CMD... runs CMD under GNU time; sets SECONDS_TAKEN, RSS_KIB and OUT_FILE (its
# stdout). Called directly, never in a subshell, so that a failure stops the whole run.
timed() {
	local name=$1
	shift
	local tf=$RUN_DIR/time.out start end
	OUT_FILE=$RUN_DIR/$name.out
	start=$EPOCHREALTIME
	if ! "$TIME" -f '%M' -o "$tf" "$@" >"$OUT_FILE" 2>"$RUN_DIR/$name.err"; then
		printf 'bench import: error: %s failed: %s\n' "$name" "$*" >&2
		tail -n 20 "$OUT_FILE" "$RUN_DIR/$name.err" >&2
		exit 1
	fi
	end=$EPOCHREALTIME
	RSS_KIB=$(tail -n 1 "$tf")
	SECONDS_TAKEN=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", e - s }')
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
maximum() { printf '%s\n' "$@" | sort -g | tail -n 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
kib_mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 <= b + 0) ? "yes" : "no" }'; }

# layer_size REF prints the size of the single layer of REF's manifest, as the registry has it.
layer_size() {
	local m n
	m=$("$CRANE" manifest --insecure "$1") || die "crane manifest $1 failed"
	n=$(jq '.layers | length' <<<"$m")
	[[ $n == 1 ]] || die "$1 has $n layers, expected 1"
	jq '.layers[0].size' <<<"$m"
}

PEER_WALL=
PEER_RSS=()      # per step, KiB: convert tar crane
PEER_STEP_MAX=(0 0 0)

# peer SOURCE REF runs the peer pipeline, timed as one unit from the first step to the last.
peer() {
	local src=$1 ref=$2 w=$RUN_DIR/peer start end i
	chmod -R u+w "$w" 2>/dev/null || true
	rm -rf "$w"
	mkdir -p "$w/disk"
	sync
	start=$EPOCHREALTIME
	timed peer-convert qemu-img convert -O qcow2 "$src" "$w/disk/disk.img"
	PEER_RSS=("$RSS_KIB")
	chmod 0444 "$w/disk/disk.img"
	chmod 0555 "$w/disk"
	timed peer-tar tar --owner=107 --group=107 --numeric-owner -C "$w" -cf "$w/layer.tar" disk
	PEER_RSS+=("$RSS_KIB")
	timed peer-crane "$CRANE" append -f "$w/layer.tar" -t "$ref" --insecure
	PEER_RSS+=("$RSS_KIB")
	end=$EPOCHREALTIME
	PEER_WALL=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", e - s }')
	for i in 0 1 2; do
		if ((PEER_RSS[i] > PEER_STEP_MAX[i])); then PEER_STEP_MAX[i]=${PEER_RSS[i]}; fi
	done
	chmod -R u+w "$w"
	rm -rf "$w"
}

# ours SOURCE REF [CACHE_DIR] runs imagectl import; with CACHE_DIR, IMAGEPIPE_CACHE points there.
ours() {
	local src=$1 ref=$2 cache=${3:-$CACHE}
	sync
	timed imagectl env IMAGEPIPE_CACHE="$cache" "$IMAGECTL" import "$src" "$ref" --quiet
}

# run_cache [warm] makes a fresh IMAGEPIPE_CACHE for one imagectl run and prints its path: empty,
# or with warm, holding only the digest cache the warm-up filled (DIGESTS). imagectl also keeps
# builds.json there (where each build was pushed) and mounts the blobs from that repository
# instead of uploading them, so a run with the shared cache would measure a mount, not an import.
run_cache() {
	local d
	d=$(mktemp -d "$RUN_DIR/cache.XXXXXX")
	if [[ ${1:-} == warm ]]; then cp "$DIGESTS" "$d/digests.json"; fi
	printf '%s\n' "$d"
}

ROWS=()
NOTES=()

# run_case KEY LABEL SOURCE TARGET COLD: warm-up of each tool, then REPS measured runs of each in
# alternating order; with COLD=1 each rep also has an imagectl run with an empty IMAGEPIPE_CACHE.
run_case() {
	local key=$1 label=$2 src=$3 target=$4 cold=$5
	log "$key: warm-up"
	ours "$src" "$HOSTPORT/acme/ours-$key-0:1"
	peer "$src" "$HOSTPORT/acme/peer-$key-0:1"
	PEER_STEP_MAX=(0 0 0)
	[[ -f $CACHE/digests.json ]] || die "imagectl left no $CACHE/digests.json after the warm-up"
	cp "$CACHE/digests.json" "$RUN_DIR/digests.json"
	DIGESTS=$RUN_DIR/digests.json
	cdir=$(run_cache warm)
	check_digest_cached "$src" "$HOSTPORT/acme/ours-$key-0:1" "$cdir"
	rm -rf "$cdir"

	local it=() ir=() pt=() pr=() ct=() cr=() mt=() mr=() rep tool order cdir
	for ((rep = 1; rep <= REPS; rep++)); do
		log "$key: rep $rep/$REPS"
		if ((rep % 2)); then order="ours cold mount peer"; else order="peer mount cold ours"; fi
		for tool in $order; do
			case $tool in
			ours)
				cdir=$(run_cache warm)
				ours "$src" "$HOSTPORT/acme/ours-$key-$rep:1" "$cdir"
				it+=("$SECONDS_TAKEN") ir+=("$RSS_KIB")
				rm -rf "$cdir"
				;;
			cold)
				((cold)) || continue
				cdir=$(run_cache)
				ours "$src" "$HOSTPORT/acme/ours-$key-cold-$rep:1" "$cdir"
				ct+=("$SECONDS_TAKEN") cr+=("$RSS_KIB")
				rm -rf "$cdir"
				;;
			mount)
				# The shared cache, whose builds.json knows the warm-up's repository.
				((cold)) || continue
				ours "$src" "$HOSTPORT/acme/ours-$key-mount-$rep:1"
				mt+=("$SECONDS_TAKEN") mr+=("$RSS_KIB")
				;;
			peer)
				peer "$src" "$HOSTPORT/acme/peer-$key-$rep:1"
				pt+=("$PEER_WALL") pr+=("$(maximum "${PEER_RSS[@]}")")
				;;
			esac
		done
	done

	local imed pmed imax pmax isize psize r
	imed=$(median "${it[@]}")
	pmed=$(median "${pt[@]}")
	imax=$(maximum "${ir[@]}")
	pmax=$(maximum "${pr[@]}")
	isize=$(layer_size "$HOSTPORT/acme/ours-$key-1:1")
	psize=$(layer_size "$HOSTPORT/acme/peer-$key-1:1")
	r=$(ratio "$imed" "$pmed")
	ROWS+=("| $label | $imed | $pmed | ${r}× | ≤ ${target}× | $(le "$r" "$target") | $(kib_mib "$imax") | $(kib_mib "$pmax") | $(mib "$isize") | $(mib "$psize") |")
	NOTES+=("$key peer MaxRSS per step (MiB, max over the measured runs): qemu-img convert $(kib_mib "${PEER_STEP_MAX[0]}"), tar $(kib_mib "${PEER_STEP_MAX[1]}"), crane append $(kib_mib "${PEER_STEP_MAX[2]}"); walls (s) imagectl: ${it[*]}; peer: ${pt[*]}")
	if ((cold)); then
		local cmed cmax cr_
		cmed=$(median "${ct[@]}")
		cmax=$(maximum "${cr[@]}")
		cr_=$(ratio "$cmed" "$pmed")
		ROWS+=("| $label, cold digest cache (source hashed in the run) | $cmed | $pmed | ${cr_}× | ≤ ${target}× | $(le "$cr_" "$target") | $(kib_mib "$cmax") | $(kib_mib "$pmax") | $(mib "$isize") | $(mib "$psize") |")
		NOTES+=("$key cold-digest-cache walls (s): ${ct[*]}")
		local mmed mr_ mup
		mmed=$(median "${mt[@]}")
		mr_=$(ratio "$mmed" "$pmed")
		mup=$(layer_size "$HOSTPORT/acme/ours-$key-mount-1:1")
		ROWS+=("| $label to a new repository, shared cache (blobs mounted from the warm-up, 0 uploaded) | $mmed | $pmed | ${mr_}× | — (info) | — | $(kib_mib "$(maximum "${mr[@]}")") | $(kib_mib "$pmax") | $(mib "$mup") | $(mib "$psize") |")
		NOTES+=("$key mount walls (s): ${mt[*]}")
	fi
}

# check_digest_cached SOURCE REF CACHE_DIR fails unless imagectl takes SOURCE's digest from the
# digest cache in CACHE_DIR (an untimed run with -v, which logs cache hits).
check_digest_cached() {
	IMAGEPIPE_CACHE=$3 "$IMAGECTL" -v import "$1" "$2" --quiet >/dev/null 2>"$RUN_DIR/cachecheck.err" ||
		{
			tail -n 20 "$RUN_DIR/cachecheck.err" >&2
			die "imagectl -v import $1 $2 failed"
		}
	grep -q 'digest cache hit' "$RUN_DIR/cachecheck.err" ||
		die "imagectl did not take the digest of $1 from $CACHE/digests.json after the warm-up: the measured runs would hash the source"
}

# verify REF pulls REF with skopeo and checks its disk against a.raw with qemu-img, and the tar
# entries' ownership and mode.
verify() {
	local ref=$1 out=$RUN_DIR/verify
	rm -rf "$out"
	mkdir -p "$out/x"
	skopeo copy -q --src-tls-verify=false "docker://$ref" "dir:$out/oci" >&2 || die "skopeo copy docker://$ref failed"
	local digest mt blob
	digest=$(jq -r '.layers[0].digest' "$out/oci/manifest.json")
	mt=$(jq -r '.layers[0].mediaType' "$out/oci/manifest.json")
	blob=$out/oci/${digest#sha256:}
	[[ -f $blob ]] || die "verify: layer blob $digest not in skopeo's dir:$out/oci"
	[[ $mt == *gzip* ]] || die "verify: layer media type $mt is not gzip"
	tar -xzf "$blob" -C "$out/x" disk/disk.img || die "verify: cannot extract disk/disk.img from layer $digest"
	local cmp
	cmp=$(qemu-img compare "$RAW" "$out/x/disk/disk.img" 2>&1) || true
	[[ $cmp == *"Images are identical"* ]] || die "verify: qemu-img compare $RAW disk.img from $ref: $cmp"
	local listing
	listing=$(tar --numeric-owner -tvzf "$blob")
	log "layer listing: $(tr '\n' ';' <<<"$listing")"
	awk '$2 != "107/107" { bad = 1 } END { exit bad }' <<<"$listing" ||
		die "verify: layer entries not all owned 107/107: $listing"
	grep -Eq '^-r--r--r-- 107/107 .* disk/disk\.img$' <<<"$listing" ||
		die "verify: disk/disk.img is not -r--r--r-- 107/107: $listing"
	rm -rf "$out"
	log "verified $ref: qemu-img compare says identical to a.raw, entries 107/107, disk.img 0444"
}

main() {
	check_tools
	resolve_imagectl
	[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPS must be a positive integer, got '$REPS'"
	# bench.sh calls `import.sh --check` first, so that a missing tool stops it before it spends
	# minutes on the convert cases.
	[[ ${1:-} != --check ]] || return 0

	check_inputs
	RUN_DIR=$(mktemp -d "$BENCH_DIR/import.XXXXXX")
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	# Run a copy: a rebuild of bin/imagectl during the run would change the build key (it records
	# imagectl's version), and the re-import would then build anew instead of reusing.
	IMAGECTL_SHOWN=$IMAGECTL
	cp "$IMAGECTL" "$RUN_DIR/imagectl"
	IMAGECTL=$RUN_DIR/imagectl
	IMAGECTL_VERSION=$("$IMAGECTL" --version 2>/dev/null | head -n 1)
	start_registry

	run_case a "(f) import sparse raw (a.raw)" "$RAW" "$TARGET_RAW" 1
	verify "$HOSTPORT/acme/ours-a-1:1"

	# Re-import: the same source and options to a reference that already holds them.
	local reref=$HOSTPORT/acme/ours-a-1:1 rt=() rr=() rep reused up lsize
	for ((rep = 1; rep <= REPS; rep++)); do
		log "re-import: rep $rep/$REPS"
		sync
		timed reimport "$IMAGECTL" import "$RAW" "$reref" -o json
		reused=$(jq -r '.reused' "$OUT_FILE")
		up=$(jq -r '.uploadedBytes' "$OUT_FILE")
		lsize=$(jq -r '.layerSize' "$OUT_FILE")
		[[ $up == 0 ]] || die "re-import of $RAW to $reref uploaded $up layer bytes (uploadedBytes must be 0): $(tr -d '\n' <"$OUT_FILE")"
		[[ $reused == true ]] || die "re-import of $RAW to $reref did not report \"reused\": true: $(tr -d '\n' <"$OUT_FILE")"
		rt+=("$SECONDS_TAKEN") rr+=("$RSS_KIB")
	done
	local rmed
	rmed=$(median "${rt[@]}")
	ROWS+=("| (g) re-import a.raw to ${reref#"$HOSTPORT"/} (reused, 0 bytes uploaded) | $rmed | — | — | ≤ ${TARGET_REIMPORT_S} s, 0 bytes | $(le "$rmed" "$TARGET_REIMPORT_S") | $(kib_mib "$(maximum "${rr[@]}")") | — | $(mib "$lsize") (0 uploaded) | — |")
	NOTES+=("re-import walls (s): ${rt[*]}")

	run_case z "(h) import zlib qcow2 (c-zlib.qcow2)" "$ZLIB" "$TARGET_ZLIB" 0

	# shellcheck disable=SC2016 # backticks are Markdown here
	{
		printf '\n## imagectl import vs the peer pipeline (qemu-img convert + tar + crane append)\n\n'
		printf -- '- registry: %s, `%s serve CONFIG` on %s (filesystem storage in a temp dir, delete enabled, log level warn)\n' \
			"$("$REGISTRY" --version 2>/dev/null | head -n 1)" "$REGISTRY" "$HOSTPORT"
		printf -- '- imagectl: %s (%s), run from a copy made at the start\n' "$IMAGECTL_SHOWN" "$IMAGECTL_VERSION"
		printf -- '- crane: %s; skopeo: %s; %s\n' "$(cat "$TOOLS_BIN/.crane.version" 2>/dev/null || echo unknown)" \
			"$(skopeo --version)" "$(tar --version | head -n 1)"
		printf -- '- method: per case one unmeasured warm-up run of each tool (page cache warm for both), then %s measured runs of each, alternating which goes first, `sync` before every run outside the timing; every run pushes to a fresh repository (no dedup); wall is the median. Every imagectl run gets its own fresh IMAGEPIPE_CACHE: in the measured runs it holds only a copy of the digests.json the warm-up filled, so the source digest comes from imagectl'"'"'s cache (checked with `-v`) while there is no builds.json, from which imagectl would mount the warm-up'"'"'s blobs instead of uploading; in the "cold digest cache" row it is empty and the source is hashed during the run; the "another repository" row uses the shared IMAGEPIPE_CACHE and measures that mount (one run of each per rep). The peer pipeline is timed as one unit from the start of qemu-img convert to the end of crane append; its MaxRSS is the largest of its three steps (`/usr/bin/time -f %%M`, max over the measured runs). Layer sizes are the registry manifest'"'"'s layers[0].size of run 1. The re-import row is %s runs of the same reference; each must report "reused": true and "uploadedBytes": 0\n' "$REPS" "$REPS"
		printf -- '- correctness: `skopeo copy` of ours-a-1:1 to dir:, layer blob (gzip) extracted with tar, `qemu-img compare a.raw disk.img` identical, entries 107/107, disk.img -r--r--r--\n\n'
		printf '| case | imagectl wall (s) | peer pipeline wall (s) | ratio imagectl/peer | target | met | imagectl MaxRSS (MiB) | peer MaxRSS (MiB, max of 3 steps) | imagectl layer (MiB) | peer layer (MiB) |\n'
		printf '|---|---:|---:|---:|---|---|---:|---:|---:|---:|\n'
		printf '%s\n' "${ROWS[@]}"
		printf '\nNotes:\n\n'
		printf -- '- %s\n' "${NOTES[@]}"
		printf '\nCommands (N = run number, SOURCE = %s or %s, W = a fresh empty directory):\n\n' "$RAW" "$ZLIB"
		printf -- '- registry: `OTEL_TRACES_EXPORTER=none %s serve %s`\n' "$REGISTRY" "$RUN_DIR/registry.yml"
		printf -- '- peer: `qemu-img convert -O qcow2 SOURCE W/disk/disk.img && chmod 0444 W/disk/disk.img && chmod 0555 W/disk && tar --owner=107 --group=107 --numeric-owner -C W -cf W/layer.tar disk && %s append -f W/layer.tar -t %s/acme/peer-N:1 --insecure`\n' "$CRANE" "$HOSTPORT"
		printf -- '- imagectl: `IMAGEPIPE_CACHE=C %s import SOURCE %s/acme/ours-N:1 --quiet` (C a fresh dir holding a copy of %s/digests.json after the warm-up)\n' "$IMAGECTL_SHOWN" "$HOSTPORT" "$CACHE"
		printf -- '- imagectl, cold digest cache: `IMAGEPIPE_CACHE=$(mktemp -d) %s import %s %s/acme/ours-a-cold-N:1 --quiet`\n' "$IMAGECTL_SHOWN" "$RAW" "$HOSTPORT"
		printf -- '- imagectl, another repository: `IMAGEPIPE_CACHE=%s %s import %s %s/acme/ours-a-mount-N:1 --quiet`\n' "$CACHE" "$IMAGECTL_SHOWN" "$RAW" "$HOSTPORT"
		printf -- '- re-import: `%s import %s %s -o json`\n' "$IMAGECTL_SHOWN" "$RAW" "$reref"
		printf -- '- check: `skopeo copy --src-tls-verify=false docker://%s dir:OUT`, `tar -xzf OUT/<layers[0].digest> disk/disk.img`, `qemu-img compare %s disk.img`, `tar --numeric-owner -tvzf OUT/<layers[0].digest>`\n' "$HOSTPORT/acme/ours-a-1:1" "$RAW"
	}
}

main "$@"
