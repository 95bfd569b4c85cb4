#!/usr/bin/env bash
# `make bench-profile`: instructions per request for the forward path and the
# replay path, counted by callgrind (repeatable where wall-clock time on this
# machine is not), and the functions that spend them.
#
# idemproxy runs under `valgrind --tool=callgrind`; callgrind_control cuts
# the run into phases, each dumped to its own file:
#   1 startup   up to the first /readyz answer
#   2 idle      BENCH_PROFILE_IDLE_S seconds of nothing: the baseline rate
#   3 forward   N first attempts, one at a time (tests/bench/clients/client.py)
#   4 replay    the same N requests again: N replays, from the replay cache
#               (replay_cache_ttl is 10m here: under callgrind the forward
#               phase outlasts the default 10s, and its entries would be
#               gone, leaving the store's replays to be counted instead)
# Per request = (phase Ir - idle Ir/s x phase seconds) / N. Only idemproxy's
# own process is counted (libraries included; PostgreSQL and the kernel not).
#
# Output: build-bench/profile.txt (the summary, then for the forward and the
# replay phase the costliest functions by self cost (cg_top.py) and by
# inclusive cost (callgrind_annotate)), build-bench/callgrind/ (the dumps).
# Environment: BENCH_PROFILE_N (default 2000), BENCH_PROFILE_IDLE_S
# (default 3), BENCH_PROFILE_WORKERS (default 2), BENCH_PROFILE_LOG_LEVEL
# (default warn; info adds the request log's cost: log_request_line).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
OUT=${BENCH_OUT:-build-bench}
BIN=${BENCH_BIN:-$OUT/bin}
N=${BENCH_PROFILE_N:-2000}
IDLE_S=${BENCH_PROFILE_IDLE_S:-3}
WORKERS=${BENCH_PROFILE_WORKERS:-2}
LOG_LEVEL=${BENCH_PROFILE_LOG_LEVEL:-warn}
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3
HERE=tests/bench
LOGS=$OUT/logs/profile
CG=$OUT/callgrind
REPORT=$OUT/profile.txt
TAG=p$(date +%s)
START_S=$SECONDS

TMP=""
PG_DIR=""
STUB_PID=""
PROXY_PID=""

# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	stop_pid "$PROXY_PID"
	stop_pid "$STUB_PID"
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

now() {
	date +%s.%N
}

# Ends the current phase: its counts go to the next dump file.
dump() {
	callgrind_control -d "$1" "$PROXY_PID" >>"$LOGS/callgrind_control.log" 2>&1 ||
		die "callgrind_control could not dump $1 (see $LOGS/callgrind_control.log)"
}

# The total instruction count of one dump file.
total_ir() {
	sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$1"
}

# phase_cost FILE SECONDS: Ir minus the idle rate over the same time.
phase_cost() {
	awk -v ir="$(total_ir "$1")" -v rate="$IDLE_RATE" -v s="$2" \
		'BEGIN { printf "%.0f\n", ir - rate * s }'
}

annotate() {
	local title=$1 file=$2
	printf '\n==== %s: top functions, exclusive Ir (%s) ====\n' "$title" "$file"
	"$PYTHON" "$HERE/report/cg_top.py" "$file" 40
	printf '\n==== %s: top functions, inclusive Ir ====\n' "$title"
	callgrind_annotate --auto=no --inclusive=yes --threshold=99 "$file" 2>&1 |
		sed -n '/file:function/,$p' | sed -n '1,42p'
}

main() {
	for tool in valgrind callgrind_control callgrind_annotate curl; do
		command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run \`make bench-deps\`"
	done
	[ -x "$BIN/idemproxy" ] && [ -x "$BIN/stub_upstream" ] || die "run \`make bench-profile\` (it builds $BIN first)"
	mkdir -p "$LOGS" "$CG"
	rm -f "$LOGS"/* "$CG"/* "$REPORT"
	TMP=$(mktemp -d /tmp/idemproxy-profile.XXXXXX)
	chmod 755 "$TMP"
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	# Instructions, not time, are measured: durability would only slow
	# the run down.
	start_pg "-c fsync=off -c synchronous_commit=off"
	start_stub
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	migrate
	note "idemproxy under callgrind, $WORKERS workers; $N forwards, then $N replays"
	# Uncompressed names: each dump must name its functions itself for
	# callgrind_annotate to read it alone.
	EXTRA_CONF='replay_cache_ttl = "10m";' PROXY_WAIT_TENTHS=600 \
		start_proxy "$LOG_LEVEL" valgrind --tool=callgrind \
		--compress-strings=no --compress-pos=no \
		--callgrind-out-file="$ROOT/$CG/callgrind.out" --log-file="$ROOT/$LOGS/valgrind.log"
	dump startup

	local t0 t1 t2 t3
	t0=$(now)
	sleep "$IDLE_S"
	dump idle
	t1=$(now)
	"$PYTHON" "$HERE/clients/client.py" "$PROXY_PORT" forward "$N" "$TAG" ||
		die "the forward phase failed"
	dump forward
	t2=$(now)
	"$PYTHON" "$HERE/clients/client.py" "$PROXY_PORT" replay "$N" "$TAG" ||
		die "the replay phase failed"
	dump replay
	t3=$(now)
	stop_pid "$PROXY_PID"
	PROXY_PID=""

	local stats
	stats=$(stub_ctl GET stats)
	note "upstream saw $stats"
	[ "$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' <<<"$stats")" = "$N" ] &&
		[ "$(sed -n 's/.*"duplicated_keys":\([0-9]*\).*/\1/p' <<<"$stats")" = 0 ] ||
		die "the upstream did not see each of the $N keys exactly once: $stats"

	local idle_s fwd_s rep_s fwd rep
	idle_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
	fwd_s=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')
	rep_s=$(awk -v a="$t2" -v b="$t3" 'BEGIN { print b - a }')
	IDLE_RATE=$(awk -v ir="$(total_ir "$CG/callgrind.out.2")" -v s="$idle_s" \
		'BEGIN { printf "%.0f\n", ir / s }')
	fwd=$(phase_cost "$CG/callgrind.out.3" "$fwd_s")
	rep=$(phase_cost "$CG/callgrind.out.4" "$rep_s")
	local fwd_ms rep_ms
	fwd_ms=$("$PYTHON" "$HERE/report/cg_top.py" "$CG/callgrind.out.3" --self __memset)
	rep_ms=$("$PYTHON" "$HERE/report/cg_top.py" "$CG/callgrind.out.4" --self __memset)
	{
		echo "idemproxy instructions per request (callgrind, $N requests per phase,"
		echo "sequential, one keep-alive connection, $WORKERS workers, log_level $LOG_LEVEL)"
		echo
		printf '%-10s %14s %10s %16s\n' phase "Ir" seconds "Ir per request"
		printf '%-10s %14s %10.2f %16s\n' startup "$(total_ir "$CG/callgrind.out.1")" 0 -
		printf '%-10s %14s %10.2f %16s\n' idle "$(total_ir "$CG/callgrind.out.2")" "$idle_s" "($IDLE_RATE Ir/s)"
		printf '%-10s %14s %10.2f %16s\n' forward "$(total_ir "$CG/callgrind.out.3")" "$fwd_s" $((fwd / N))
		printf '%-10s %14s %10.2f %16s\n' replay "$(total_ir "$CG/callgrind.out.4")" "$rep_s" $((rep / N))
		echo
		echo "forward: $((fwd / N)) Ir per request; replay: $((rep / N)) Ir per request"
		echo "(phase Ir minus the idle rate x the phase's seconds, divided by $N)"
		echo
		echo "Of these, memset (rep stosb, which callgrind counts once per byte,"
		echo "so Ir = bytes zeroed and overstates its time): forward $((fwd_ms / N)),"
		echo "replay $((rep_ms / N)) per request. Without it: forward $(((fwd - fwd_ms) / N)),"
		echo "replay $(((rep - rep_ms) / N)) Ir per request."
		annotate forward "$CG/callgrind.out.3"
		annotate replay "$CG/callgrind.out.4"
	} >"$REPORT"
	sed -n '1,17p' "$REPORT"
	echo
	echo "top functions: $REPORT"
}

main "$@"
