#!/usr/bin/env bash
# `make bench-citus` (or `make bench BENCH_CITUS=1`, after the plain
# table): the store's rows of `make bench` on a plain PostgreSQL and on a
# Citus coordinator with two workers, all on this machine, in one run, with
# their ratios.
#
# Both stores run side by side (fsync and synchronous_commit on, as in
# run.sh), each with its own idemproxy in front of the same stub upstream,
# and every row runs on both in interleaved halves (plain, Citus, plain,
# Citus), so that both see the same drift of the machine's load. The rows:
# the raw two-commit pair (pgbench; on Citus its table is distributed by
# its key), the claim and record statements (pgbench), fresh keys through
# idemproxy at 1, 16 and WIDE connections, replays of one key at 16. The
# keys are spread over 16 tenants (X-Tenant-Id, BENCH_TENANTS), so that on
# Citus they spread over the shards of both workers; a replay is of one key,
# so of one tenant and one worker. PostgreSQL's CPU per request counts every
# postmaster of the store and its children: the three of the Citus cluster.
# After every idemproxy run the stub's counts prove that no key reached the
# upstream twice.
#
# Needs the Citus extension (citus.so; `make test-citus CITUS_SRC=DIR`
# installs it). Environment as run.sh: BENCH_DURATION (seconds per row and
# store, default 8), BENCH_WORKERS (16), BENCH_WIDE (64; empty skips).
# Output: build-bench/citus.md; data in build-bench/data-citus/.
set -euo pipefail

cd "$(dirname "$0")/../.."
BENCH_SOURCE_ONLY=1 . tests/bench/run.sh
LOGS=$OUT/logs/bench-citus
DATA=$OUT/data-citus
ROWS=$DATA/rows.tsv
export BENCH_TENANTS=16
ROUTE_EXTRA='tenant = "header:X-Tenant-Id";'
CITUS_DIRS=()

citus_cleanup() {
	local rc=$? d
	trap - EXIT INT TERM
	set +e
	stop_pid "$WRK_PID" INT
	stop_pid "$PGB_PID" INT
	stop_pid "$PLAIN_PROXY_PID"
	stop_pid "$CITUS_PROXY_PID"
	stop_pid "$STUB_PID"
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	for d in "${CITUS_DIRS[@]+"${CITUS_DIRS[@]}"}"; do
		scripts/pg-local.sh stop "$d" >/dev/null 2>&1
	done
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

# A coordinator and two workers, each its own cluster with Citus loaded and
# the extension in database idemproxy, the workers joined; sets CITUS_PORT,
# CITUS_URL and CITUS_PIDS (the three postmasters).
start_citus() {
	local i dir port url ports=()
	CITUS_PIDS=""
	for i in 0 1 2; do
		dir=$TMP/citus$i
		port=$(free_port)
		url=$(PGPORT=$port PG_LOCAL_OPTS="-c fsync=on -c synchronous_commit=on \
-c full_page_writes=on -c max_connections=300 -c shared_preload_libraries=citus \
-c max_prepared_transactions=200" scripts/pg-local.sh start "$dir" 2>>"$LOGS/pg-local.log") ||
			{ cat "$LOGS/pg-local.log" >&2; die "a Citus node did not start (is citus.so installed?)"; }
		CITUS_DIRS+=("$dir")
		ports+=("$port")
		CITUS_PIDS="$CITUS_PIDS $(head -n 1 "$dir/data/postmaster.pid")"
		psql -X -q -v ON_ERROR_STOP=1 "$url" -c "CREATE EXTENSION citus" \
			>>"$LOGS/citus.log" 2>&1 || die "CREATE EXTENSION citus failed (see $LOGS/citus.log)"
		[ "$i" != 0 ] || CITUS_URL=$url
	done
	CITUS_PORT=${ports[0]}
	psql -X -q -v ON_ERROR_STOP=1 "$CITUS_URL" \
		-c "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]})" \
		-c "SELECT citus_add_node('127.0.0.1', ${ports[1]})" \
		-c "SELECT citus_add_node('127.0.0.1', ${ports[2]})" >>"$LOGS/citus.log" 2>&1 ||
		die "joining the workers failed (see $LOGS/citus.log)"
}

# The replays' tenant (replay.lua sends X-Tenant-Id 0).
prime() {
	local key=$1 body h=(-H "Idempotency-Key: $1" -H 'Content-Type: application/json' -H 'X-Tenant-Id: 0')
	body='{"amount": 1000, "currency": "eur", "description": "bench"}'
	curl -fsS -o /dev/null -X POST "$PROXY/v1/payments" "${h[@]}" -d "$body" ||
		die "priming key $key failed"
	curl -fsS -D - -o /dev/null -X POST "$PROXY/v1/payments" "${h[@]}" -d "$body" |
		grep -qi '^Idempotent-Replayed: true' || die "key $key is not replayed after its first attempt"
}

pgbench_run() {
	pgbench_pair "$1" "$2" claim_record_tenants.sql store_counts "claim+record (pgbench)"
}

# on_plain / on_citus CMD...: CMD against that store and its proxy.
on_plain() {
	PGPORT=$PLAIN_PORT PG_PID=$PLAIN_PID PG_PIDS=$PLAIN_PID PROXY_PID=$PLAIN_PROXY_PID \
		PROXY=$PLAIN_PROXY ADMIN=$PLAIN_ADMIN "$@"
}

on_citus() {
	local first=${CITUS_PIDS# }
	PGPORT=$CITUS_PORT PG_PID=${first%% *} PG_PIDS=$CITUS_PIDS PROXY_PID=$CITUS_PROXY_PID \
		PROXY=$CITUS_PROXY ADMIN=$CITUS_ADMIN "$@"
}

# both FN ID ARGS...: FN on the plain store as ID-plain, then on Citus as
# ID-citus.
both() {
	local fn=$1 id=$2
	shift 2
	on_plain "$fn" "$id-plain" "$@"
	on_citus "$fn" "$id-citus" "$@"
}

citus_main() {
	for tool in wrk pgbench psql curl; do
		command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run \`make bench-deps\`"
	done
	[ -x "$BIN/idemproxy" ] && [ -x "$BIN/stub_upstream" ] || die "run \`make bench-citus\` (it builds $BIN first)"
	rm -rf "$LOGS" "$DATA"
	rm -f "$OUT/citus.md"
	mkdir -p "$LOGS" "$DATA"
	TMP=$(mktemp -d /tmp/idemproxy-bench-citus.XXXXXX)
	chmod 755 "$TMP"
	PLAIN_PROXY_PID="" CITUS_PROXY_PID=""
	trap citus_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
	note "machine: $(nproc) cpus, load average $LOAD_START"

	start_pg "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
	PLAIN_PORT=$PGPORT PLAIN_PID=$(pg_pid) PLAIN_URL=$DB_URL
	start_citus
	start_stub

	PG_PID=$PLAIN_PID
	PROXY_PORT=$(free_port) ADMIN_PORT=$(free_port)
	DB_URL=$PLAIN_URL CONF_NAME=idemproxy-plain migrate
	psql -X -q -v ON_ERROR_STOP=1 "$PLAIN_URL" -f "$HERE/pgbench/raw_pair_table.sql" >>"$LOGS/raw_pair_table.log" 2>&1 ||
		die "creating the raw pair's table failed"
	DB_URL=$PLAIN_URL CONF_NAME=idemproxy-plain start_proxy warn
	PLAIN_PROXY_PID=$PROXY_PID PLAIN_PROXY=$PROXY PLAIN_ADMIN=$ADMIN

	PROXY_PORT=$(free_port) ADMIN_PORT=$(free_port)
	DB_URL=$CITUS_URL DB_EXTRA='distributed = "citus";' CONF_NAME=idemproxy-citus migrate
	psql -X -q -v ON_ERROR_STOP=1 "$CITUS_URL" -f "$HERE/pgbench/raw_pair_table.sql" \
		-c "SELECT create_distributed_table('bench_raw_pair', 'k')" >>"$LOGS/raw_pair_table.log" 2>&1 ||
		die "creating the distributed raw pair's table failed"
	DB_URL=$CITUS_URL DB_EXTRA='distributed = "citus";' CONF_NAME=idemproxy-citus start_proxy warn
	CITUS_PROXY_PID=$PROXY_PID CITUS_PROXY=$PROXY CITUS_ADMIN=$ADMIN
	note "plain :$PLAIN_PORT ($PLAIN_PROXY), Citus coordinator :$CITUS_PORT ($CITUS_PROXY), stub :$STUB_PORT"

	local dur=$DUR s
	DUR=2
	RECORD=0
	both proxy_run warmup fresh 16 2
	both raw_run warmup-raw 16
	both pgbench_run warmup-pgbench 16
	RECORD=1
	stub_take
	DUR=$(((dur + 1) / 2))
	for s in 1 2; do
		both raw_run raw-c16 16
		both pgbench_run pgbench-c16 16
		both proxy_run fresh-c1 fresh 1 1
		both proxy_run fresh-c16 fresh 16 2
		[ -z "$WIDE" ] || both proxy_run "fresh-c$WIDE" fresh "$WIDE" 2
		both replay_run replay-c16 16 2
	done
	DUR=$dur
	"$PYTHON" "$HERE/report/report_citus.py" --data "$DATA" --out "$OUT/citus.md" \
		--duration "$DUR" --cpus "$(nproc)" --elapsed $((SECONDS - START_S)) \
		--load "$LOAD_START / $(cut -d' ' -f1-3 /proc/loadavg)" \
		--failures "$(printf '%s\n' "${FAILURES[@]+"${FAILURES[@]}"}")"
	if [ "${#FAILURES[@]}" -gt 0 ]; then
		for f in "${FAILURES[@]}"; do
			echo "bench: CHECK FAILED: $f" >&2
		done
		die "${#FAILURES[@]} check(s) failed"
	fi
}

citus_main "$@"
