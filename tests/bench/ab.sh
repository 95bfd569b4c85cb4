#!/usr/bin/env bash
# `make bench-ab BENCH_BASE=REV`: the rows a regression check needs, for
# the proxy built at REV (the base, build-bench/base/bin) and for the
# current tree (build-bench/bin), interleaved in one run against one
# PostgreSQL and one stub upstream: fresh keys at 16 connections, replays
# at 16 connections from the replay cache and from the store (a proxy with
# replay_cache_size = 0), and fresh keys at one connection (p50).
#
# Each side has its own database in the one cluster, migrated by its own
# binary, so a base with an older schema runs on it; each slice uses keys
# of its own (run.sh's proxy_run and replay_run), and the upstream's
# counts prove after every slice that no key reached it twice. Within a
# round every row runs base then current, the next round current then
# base (A B, B A, ...), so that a drift of the machine's load over the run
# falls on both sides alike. Run.sh's functions do the slices; this file
# only starts the four proxies and chooses the order.
#
# Output: build-bench/ab.md (report/report_ab.py: medians, ratios, CPU
# per request, steal, verdicts); data in build-bench/data-ab/, logs in
# build-bench/logs/bench-ab/.
# Environment: BENCH_DURATION (seconds per slice, default 8),
# BENCH_AB_ROUNDS (default 3), BENCH_WORKERS (16); BENCH_BASE_BIN and
# BENCH_BASE_SRC (the base's binary directory and source tree) and
# BENCH_BASE_REV (its commit, for the report) are set by mk/bench.mk.
set -euo pipefail

cd "$(dirname "$0")/../.."
BENCH_SOURCE_ONLY=1 . tests/bench/run.sh
LOGS=$OUT/logs/bench-ab
DATA=$OUT/data-ab
ROWS=$DATA/rows.tsv
ROUNDS=${BENCH_AB_ROUNDS:-3}
BASE_BIN=${BENCH_BASE_BIN:-$OUT/base/bin}
BASE_SRC=${BENCH_BASE_SRC:-$OUT/base/src}
BASE_REV=${BENCH_BASE_REV:-unknown}
CUR_BIN=$BIN
declare -A AB_PID AB_PROXY AB_ADMIN

ab_cleanup() {
	local rc=$? k
	trap - EXIT INT TERM
	set +e
	stop_pid "$WRK_PID" INT
	for k in "${!AB_PID[@]}"; do
		stop_pid "${AB_PID[$k]}"
	done
	stop_pid "$STUB_PID"
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

# ab_side SIDE: the binary, database and configuration template of SIDE
# (base or cur) in BIN, DB_URL and CONF_IN.
ab_side() {
	DB_URL=${DB_URL_ROOT%/*}/idemproxy_$1
	if [ "$1" = cur ]; then
		BIN=$CUR_BIN CONF_IN=""
		return
	fi
	BIN=$BASE_BIN CONF_IN=$HERE/conf/idemproxy.conf.in
	# The base's own template, wherever its tree kept it.
	local f
	for f in "$BASE_SRC/tests/bench/conf/idemproxy.conf.in" "$BASE_SRC/tests/bench/idemproxy.conf.in"; do
		[ -f "$f" ] && CONF_IN=$f && break
	done
}

# ab_start SIDE KIND [EXTRA_CONF]: a proxy of SIDE; KIND names it (hot:
# the default configuration, store: no replay cache).
ab_start() {
	local side=$1 kind=$2
	ab_side "$side"
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	CONF_NAME=idemproxy-$side-$kind EXTRA_CONF=${3:-} start_proxy warn
	AB_PID[$side.$kind]=$PROXY_PID AB_PROXY[$side.$kind]=$PROXY
	AB_ADMIN[$side.$kind]=$ADMIN
	note "$side ($kind): $("$BIN/idemproxy" --version 2>/dev/null | head -n 1) at $PROXY"
}

# ab_use SIDE KIND: proxy_run and replay_run go through that proxy.
ab_use() {
	PROXY_PID=${AB_PID[$1.$2]} PROXY=${AB_PROXY[$1.$2]} ADMIN=${AB_ADMIN[$1.$2]}
}

# ab_row ROW ROUND SIDES: one slice of ROW for each of SIDES, in order.
# Each slice is a row of its own (ROW.SIDE.ROUND), so that the report sees
# every slice's rate and p50.
ab_row() {
	local row=$1 r=$2 side id
	for side in $3; do
		id=$row.$side.$r
		case "$row" in
		fresh-c16) ab_use "$side" hot && proxy_run "$id" fresh 16 2 ;;
		replay-c16) ab_use "$side" hot && replay_run "$id" 16 2 "from the cache" ;;
		replay-c16-store) ab_use "$side" store && replay_run "$id" 16 2 "from the store" ;;
		fresh-c1) ab_use "$side" hot && proxy_run "$id" fresh 1 1 ;;
		esac
	done
}

ab_main() {
	[ -x "$CUR_BIN/idemproxy" ] && [ -x "$BIN/stub_upstream" ] ||
		die "run \`make bench-ab BENCH_BASE=REV\` (it builds $CUR_BIN first)"
	[ -x "$BASE_BIN/idemproxy" ] || die "no base binary in $BASE_BIN"
	rm -rf "$LOGS" "$DATA"
	rm -f "$OUT/ab.md"
	mkdir -p "$LOGS" "$DATA"
	TMP=$(mktemp -d /tmp/idemproxy-bench-ab.XXXXXX)
	chmod 755 "$TMP"
	trap ab_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
	start_pg "-c fsync=on -c synchronous_commit=on -c full_page_writes=on -c max_wal_size=16GB -c checkpoint_timeout=1h"
	PG_PID=$(pg_pid)
	DB_URL_ROOT=$DB_URL
	start_stub
	local side kind r order
	for side in base cur; do
		psql_q "CREATE DATABASE idemproxy_$side" >/dev/null
		ab_side "$side"
		PROXY_PORT=$(free_port) ADMIN_PORT=$(free_port)
		migrate
		ab_start "$side" hot
		ab_start "$side" store "replay_cache_size = 0;"
	done
	RECORD=0
	local dur=$DUR
	DUR=2
	for side in base cur; do
		for kind in hot store; do
			ab_use "$side" "$kind"
			proxy_run "warmup-$side-$kind" fresh 16 2
		done
	done
	DUR=$dur
	RECORD=1
	checkpoint
	for r in $(seq "$ROUNDS"); do
		order="base cur"
		[ $((r % 2)) = 1 ] || order="cur base"
		note "round $r of $ROUNDS: $order"
		for row in fresh-c16 replay-c16 replay-c16-store fresh-c1; do
			ab_row "$row" "$r" "$order"
		done
	done
	"$PYTHON" "$HERE/report/report_ab.py" --data "$DATA" --out "$OUT/ab.md" \
		--rounds "$ROUNDS" --duration "$DUR" --workers "$WORKERS" \
		--base "$BASE_REV" --current "$(git describe --always --dirty 2>/dev/null || echo unknown)" \
		--load "$LOAD_START / $(cut -d' ' -f1-3 /proc/loadavg)" --cpus "$(nproc)" \
		--failures "$(printf '%s\n' "${FAILURES[@]+"${FAILURES[@]}"}")"
	[ "${#FAILURES[@]}" = 0 ] || die "${#FAILURES[@]} check(s) failed"
}

ab_main "$@"
