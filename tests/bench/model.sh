#!/usr/bin/env bash
# `make bench-model`: idemproxy's CPU per fresh key beside a model of an
# event-driven first attempt (evloop_model.c: one thread, one epoll set,
# libpq's asynchronous calls, idemproxy's own two statements for a new key,
# the upstream over kept-alive sockets) and beside pgbench's own CPU per raw pair, all
# against the same PostgreSQL and stub, in interleaved slices of one run.
#
# The model does the exchanges of a first attempt and nothing else a proxy
# must do; its figure is what one event loop pays for them on this machine,
# to set against the hand-off design idemproxy has (an event thread and
# workers). Every slice checks what the upstream saw: each key once, as
# many keys as answers; and that every model request left its row recorded.
#
# Output: build-bench/model.md. Environment: BENCH_MODEL_CONNS (16),
# BENCH_MODEL_SLICES (3), BENCH_MODEL_DUR (4 seconds), BENCH_WORKERS (16,
# also the model's slots).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
OUT=${BENCH_OUT:-build-bench}
BIN=${BENCH_BIN:-$OUT/bin}
CONNS=${BENCH_MODEL_CONNS:-16}
# wrk's and pgbench's threads: two, or one for a single connection
THREADS=$((CONNS < 2 ? CONNS : 2))
SLICES=${BENCH_MODEL_SLICES:-3}
DUR=${BENCH_MODEL_DUR:-4}
WORKERS=${BENCH_WORKERS:-16}
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3
HERE=tests/bench
LOGS=$OUT/logs/model
REPORT=$OUT/model.md
START_S=$SECONDS
TAG=m$(date +%s)

TMP=""
PG_DIR=""
STUB_PID=""
PROXY_PID=""
MODEL_PID=""

# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	stop_pid "$MODEL_PID"
	stop_pid "$PROXY_PID"
	stop_pid "$STUB_PID"
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

psql_db() {
	psql -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres \
		-d idemproxy "$@"
}

# wrk_slice URL TAG: fresh keys for DUR seconds; prints the requests
# answered and wrk's p50 in microseconds, after checking there were no
# errors.
wrk_slice() {
	local log=$LOGS/wrk-$2.txt line
	BENCH_HIST=/dev/null wrk -t"$THREADS" -c"$CONNS" -d"${DUR}s" --timeout 10s \
		-s "$HERE/wrk/fresh.lua" "$1" -- "$2" >"$log" 2>&1 || die "wrk failed (see $log)"
	line=$(grep '^BENCH ' "$log" | tail -n 1)
	parse_bench "$line"
	[ "$((B_status + B_connect + B_read + B_write + B_timeout))" = 0 ] ||
		die "$2: errors (see $log)"
	echo "$B_requests $B_p50_us"
}

# within N WHAT SEEN: N answers (wrk's count, which leaves out the requests
# still in flight when it stopped: at most one per connection) against SEEN.
within() {
	[ "$3" -ge "$1" ] && [ "$3" -le $(($1 + CONNS)) ] ||
		die "$2: $1 answers, $3 seen"
}

# check_upstream N WHAT: the stub saw each key once, and as many as were
# answered; then it forgets them. Waits for the requests in flight first.
check_upstream() {
	local stats
	sleep 0.5
	stats=$(stub_ctl POST reset)
	parse_stub "$stats"
	[ "$S_duplicated_keys" = 0 ] || die "$2: a key reached the upstream twice ($stats)"
	within "$1" "$2 (upstream keys)" "$S_keys"
}

completed_rows() {
	psql_db -c "SELECT count(*) FROM idempotency_records WHERE state = 'completed'"
}

# slice_row NAME PID PORT TAG WHAT: one wrk slice of fresh keys through the
# process PID listening on PORT, checked at the upstream; appends "NAME
# requests its-CPU PostgreSQL's-CPU seconds p50" to $data and sets ROW_N.
slice_row() {
	local c0 c1 p0 p1 p50
	c0=$(cpu_s "$2") p0=$(tree_cpu_s "$PG_PID")
	read -r ROW_N p50 <<<"$(wrk_slice "http://127.0.0.1:$3/v1/payments" "$4")"
	c1=$(cpu_s "$2") p1=$(tree_cpu_s "$PG_PID")
	check_upstream "$ROW_N" "$5"
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$ROW_N" \
		"$(awk -v a="$c0" -v b="$c1" 'BEGIN { print b - a }')" \
		"$(awk -v a="$p0" -v b="$p1" 'BEGIN { print b - a }')" "$DUR" "$p50" >>"$data"
}

main() {
	for tool in wrk pgbench psql curl; do
		command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run \`make bench-deps\`"
	done
	mkdir -p "$LOGS"
	TMP=$(mktemp -d /tmp/idemproxy-model.XXXXXX)
	chmod 755 "$TMP"
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	start_pg "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
	start_stub
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	PG_PID=$(pg_pid)
	migrate
	psql_db -f "$HERE/pgbench/raw_pair_table.sql" >"$LOGS/raw_pair_table.log" 2>&1 ||
		die "creating the raw pair's table failed (see $LOGS/raw_pair_table.log)"
	start_proxy warn
	"$BIN/evloop_model" --upstream "$STUB_PORT" --slots "$WORKERS" \
		--db "host=127.0.0.1 port=$PGPORT user=postgres dbname=idemproxy" \
		>"$TMP/model.out" 2>"$LOGS/model.log" &
	MODEL_PID=$!
	local model_port
	model_port=$(first_line "$TMP/model.out")
	[ -n "$model_port" ] || die "the model did not start (see $LOGS/model.log)"
	note "postgres :$PGPORT, stub :$STUB_PORT, idemproxy :$PROXY_PORT, model :$model_port; $CONNS connections, $SLICES x ${DUR}s each"

	# warm-up, not counted
	DUR=2 wrk_slice "http://127.0.0.1:$PROXY_PORT/v1/payments" "$TAG-wp" >/dev/null
	DUR=2 wrk_slice "http://127.0.0.1:$model_port/v1/payments" "$TAG-wm" >/dev/null
	stub_ctl POST reset >/dev/null

	local s c0 p0 p1 rows0 rows1 dn dp50 data=$TMP/model.tsv run=0
	: >"$data"
	for s in $(seq "$SLICES"); do
		# the stub alone, for the one-connection bound
		read -r dn dp50 <<<"$(wrk_slice "http://127.0.0.1:$STUB_PORT/v1/payments" "$TAG-d$s")"
		stub_ctl POST reset >/dev/null
		printf 'direct\t%s\t0\t0\t%s\t%s\n' "$dn" "$DUR" "$dp50" >>"$data"
		slice_row idemproxy "$PROXY_PID" "$PROXY_PORT" "$TAG-p$s" "idemproxy slice $s"
		rows0=$(completed_rows)
		slice_row model "$MODEL_PID" "$model_port" "$TAG-m$s" "model slice $s"
		rows1=$(completed_rows)
		within "$ROW_N" "model slice $s (rows recorded)" "$((rows1 - rows0))"

		run=$((run + 1))
		(cd "$TMP" && exec pgbench -h 127.0.0.1 -p "$PGPORT" -U postgres -n \
			-M prepared -c "$CONNS" -j "$THREADS" -T "$DUR" -D run="$((900 + run))" -D n=0 \
			-f "$ROOT/$HERE/pgbench/raw_pair.sql" idemproxy) >"$LOGS/pgbench-$s.txt" 2>&1 &
		local pgb=$! last="" cur
		sleep 0.5
		c0=$(cpu_s "$pgb") p0=$(tree_cpu_s "$PG_PID")
		local t0=$SECONDS
		rows0=$(psql_db -c "SELECT count(*) FROM bench_raw_pair WHERE status IS NOT NULL")
		local w0 w1
		w0=$(date +%s.%N)
		# pgbench's CPU just before it ends, and the pairs recorded by then
		while cur=$(cpu_s "$pgb" 2>/dev/null) && [ $((SECONDS - t0)) -lt $((DUR - 1)) ]; do
			last=$cur
			sleep 0.1
		done
		rows1=$(psql_db -c "SELECT count(*) FROM bench_raw_pair WHERE status IS NOT NULL")
		w1=$(date +%s.%N)
		p1=$(tree_cpu_s "$PG_PID")
		[ -n "$last" ] || last=$c0
		wait "$pgb" || die "pgbench failed (see $LOGS/pgbench-$s.txt)"
		# its rate over the window the pairs were counted in, not DUR;
		# its mean latency in microseconds in the p50's place
		printf 'pgbench raw pair\t%s\t%s\t%s\t%s\t%s\n' "$((rows1 - rows0))" \
			"$(awk -v a="$c0" -v b="$last" 'BEGIN { print b - a }')" \
			"$(awk -v a="$p0" -v b="$p1" 'BEGIN { print b - a }')" \
			"$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')" \
			"$(awk '/^latency average/ { printf "%.0f", $4 * 1000 }' "$LOGS/pgbench-$s.txt")" >>"$data"
	done

	"$PYTHON" - "$data" "$REPORT" "$CONNS" "$DUR" "$((SECONDS - START_S))" <<'EOF'
import sys
from collections import defaultdict
data, out, conns, dur, elapsed = sys.argv[1:]
rows = defaultdict(list)
lat = defaultdict(list)
for line in open(data):
    name, n, cpu, pg, secs, us = line.rstrip("\n").split("\t")
    rows[name].append((int(n), float(cpu), float(pg), float(secs)))
    if us:
        lat[name].append(int(us))
lines = ["# Event-driven model beside idemproxy", "",
         "%s connections, fresh keys, %s s slices interleaved, %s s in all."
         % (conns, dur, elapsed), "",
         "| who | slices: requests or pairs per second | p50 per slice (pgbench: mean) | own CPU per request | PostgreSQL CPU per request |",
         "|---|---|---|---:|---:|"]
per = {}
for name in ("direct", "idemproxy", "model", "pgbench raw pair"):
    r = rows.get(name, [])
    n = sum(x[0] for x in r)
    if not n:
        continue
    cpu = sum(x[1] for x in r) / n * 1e6
    pg = sum(x[2] for x in r) / n * 1e6
    if cpu > 0:  # a pgbench window too short to tick (BENCH_MODEL_DUR < 3)
        per[name] = cpu
    rates = ", ".join("%.0f" % (x[0] / x[3]) for x in r)
    lats = ", ".join("%.2f ms" % (u / 1000) for u in lat[name]) or "-"
    if name == "direct":
        lines.append("| the stub alone (wrk to it) | %s | %s | - | - |"
                     % (rates, lats))
        continue
    lines.append("| %s | %s | %s | %.0f µs | %.0f µs |"
                 % (name, rates, lats, cpu, pg))
lines.append("")
if conns == "1" and lat["direct"] and lat["pgbench raw pair"]:
    # the one-connection target of `make bench`, slice by slice
    bounds = [d + 1.3 * p for d, p in zip(lat["direct"],
                                            lat["pgbench raw pair"])]
    lines.append("The one-connection bound of `make bench` (the stub's p50 "
                 "+ 1.3 x the raw pair's mean latency), slice by slice: "
                 + ", ".join("%.2f ms" % (b / 1000) for b in bounds) + ".")
    for name in ("idemproxy", "model"):
        if lat[name]:
            lines.append("%s's p50 over it, slice by slice: %s." % (
                name, ", ".join("%.2f" % (u / b) for u, b in
                                zip(lat[name], bounds))))
    lines.append("")
if "idemproxy" in per and "model" in per:
    lines.append("idemproxy / model, own CPU per request: %.2f."
                 % (per["idemproxy"] / per["model"]))
if "model" in per and "pgbench raw pair" in per:
    lines.append("model / pgbench, own CPU per request (pair): %.2f."
                 % (per["model"] / per["pgbench raw pair"]))
lines.append("")
lines.append("pgbench rows: its CPU from 0.5 s after the start to about 1 s "
             "before its end, over the pairs recorded meanwhile (rows "
             "counted in the table, and its rate over the time they were "
             "counted in); PostgreSQL's over the same window.")
text = "\n".join(lines) + "\n"
open(out, "w").write(text)
sys.stdout.write("\n" + text)
EOF
}

main "$@"
