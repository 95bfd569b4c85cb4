#!/usr/bin/env bash
# `make bench`: throughput, latency and CPU per request of idemproxy next to
# what bounds it, measured in one run on this machine, so that ratios mean
# something even when absolute numbers do not.
#
# Starts, each on a free port: a throwaway PostgreSQL with fsync and
# synchronous_commit on (scripts/pg-local.sh), the C stub upstream
# (tests/bench/programs/stub_upstream.c), nginx as a plain keep-alive reverse proxy in
# front of the same stub, and idemproxy (build-bench/bin, -O2). wrk drives
# each with the Lua scripts beside this file; pgbench runs exactly the
# statements idemproxy sends for a first attempt (and for a replay) against
# the same database, and the raw two-commit pair (raw_pair.sql) on a table
# with only its primary key: the store's limit. Every row counts the CPU
# time PostgreSQL (the postmaster and all its children) and the proxy
# (idemproxy, or nginx's processes) spent per request, from /proc. After every idemproxy run the stub's counts prove that
# no key reached the upstream twice and that every forward reached it once;
# a violation fails the bench (exit 1) after the table is written.
#
# The runs whose ratio is a target are cut into halves and interleaved
# (A B A B; the 16- and 64-connection groups A B B A): the rest of the
# machine's load, and PostgreSQL's fsync latency with it, drift over
# seconds, and both sides of a ratio should see the same drift. Each row's
# percentiles come from the merged latency histograms of its slices (wrk's,
# and pgbench's per-transaction log).
#
# Output: the table on stdout and in build-bench/results.md; per-run data in
# build-bench/data/; each tool's output in build-bench/logs/bench/.
#
# The one-connection latency rows run twice through idemproxy: the proxy
# everything else uses (busy_poll off, the default) and a second one with
# busy_poll = BENCH_BUSY_POLL.
#
# Environment: BENCH_DURATION (seconds per run, default 8), BENCH_WORKERS
# (idemproxy workers, default 16), BENCH_WIDE (the wide concurrency, default
# 64; empty skips those runs), BENCH_RSS_MAX_S (time allowed for the memory
# check's 200,000 requests, default 120), BENCH_RSS_WARM_S (the mixed load
# before the memory check counts, default 12: the replay cache's 10 s window
# filled), BENCH_BUSY_POLL (busy_poll of the second proxy, default 2ms).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
OUT=${BENCH_OUT:-build-bench}
BIN=${BENCH_BIN:-$OUT/bin}
DUR=${BENCH_DURATION:-8}
WORKERS=${BENCH_WORKERS:-16}
WIDE=${BENCH_WIDE-64}
RSS_MAX_S=${BENCH_RSS_MAX_S:-120}
RSS_WARM_S=${BENCH_RSS_WARM_S:-12}
BUSY=${BENCH_BUSY_POLL:-2ms}
RSS_COUNTS="20000 50000 100000 150000 200000"
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3
HERE=tests/bench
LOGS=$OUT/logs/bench
DATA=$OUT/data
ROWS=$DATA/rows.tsv
TAG=b$(date +%s)

TMP=""
PG_DIR=""
PG_PID=""
STUB_PID=""
PROXY_PID=""
BUSY_PID=""
SEAL_PID=""
ALONE_PID=""
NGINX_PID=""
WRK_PID=""
PGB_PID=""
FAILURES=()
START_S=$SECONDS

# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

fail() {
	echo "bench: CHECK FAILED: $*" >&2
	FAILURES+=("$*")
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	stop_pid "$WRK_PID" INT
	stop_pid "$PGB_PID" INT
	stop_pid "$PROXY_PID"
	stop_pid "$BUSY_PID"
	stop_pid "$SEAL_PID"
	stop_pid "$ALONE_PID"
	for p in $TOMB_PIDS; do
		stop_pid "$p"
	done
	stop_pid "$NGINX_PID" QUIT
	stop_pid "$STUB_PID"
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

# ---- the services -------------------------------------------------------

start_nginx() {
	local dir=$TMP/nginx
	NGINX_PORT=$(free_port)
	mkdir -p "$dir"
	chmod 755 "$dir"
	sed -e "s#@PREFIX@#$dir#g" -e "s/@PORT@/$NGINX_PORT/" \
		-e "s/@UPSTREAM_PORT@/$STUB_PORT/" -e "s/@WORKERS@/auto/" \
		"$HERE/conf/nginx.conf.in" >"$dir/nginx.conf"
	nginx -p "$dir/" -c "$dir/nginx.conf" -g 'daemon off;' \
		>"$LOGS/nginx.log" 2>&1 &
	NGINX_PID=$!
	NGINX=http://127.0.0.1:$NGINX_PORT
	wait_http "$NGINX/__stub/stats" nginx
}

# The second idemproxy, with busy_poll on: BUSY_PID, BUSY_PROXY, BUSY_ADMIN.
start_busy_proxy() {
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN port=$PROXY_PORT
	local aport=$ADMIN_PORT
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	CONF_NAME=idemproxy-busy BUSY_POLL=$BUSY start_proxy warn
	BUSY_PID=$PROXY_PID BUSY_PROXY=$PROXY BUSY_ADMIN=$ADMIN
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin PROXY_PORT=$port
	ADMIN_PORT=$aport
}

# busy_run ARGS...: proxy_run through the busy_poll proxy.
busy_run() {
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN
	PROXY_PID=$BUSY_PID PROXY=$BUSY_PROXY ADMIN=$BUSY_ADMIN
	proxy_run "$@"
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin
}

restart_proxy() {
	stop_pid "$PROXY_PID"
	PROXY_PID=""
	start_proxy "$1"
}

# Switches the running proxy's log level (a SIGHUP reload), so that the two
# levels are compared on one warm process.
set_log_level() {
	local level=$1 before
	write_conf "$level" >/dev/null
	before=$(grep -c 'configuration reloaded' "$LOGS/idemproxy.log" || true)
	kill -HUP "$PROXY_PID"
	# The reload is logged at info: at warn, give it a moment instead.
	for _ in $(seq 50); do
		[ "$(grep -c 'configuration reloaded' "$LOGS/idemproxy.log" || true)" -gt "$before" ] && return 0
		sleep 0.1
	done
	[ "$level" = info ] && die "idemproxy did not reload its configuration"
	return 0
}

# A third idemproxy with store_encryption on: SEAL_PID, SEAL_PROXY,
# SEAL_ADMIN. seal_run ARGS...: proxy_run through it.
start_seal_proxy() {
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN port=$PROXY_PORT
	local aport=$ADMIN_PORT keys=$TMP/seal.keys
	(umask 077 && printf 'active = bench\nbench %s\n' \
		"$(head -c 32 /dev/urandom | base64)" >"$keys")
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	CONF_NAME=idemproxy-seal EXTRA_CONF="store_encryption = { keys = \"$keys\"; };" \
		start_proxy warn
	SEAL_PID=$PROXY_PID SEAL_PROXY=$PROXY SEAL_ADMIN=$ADMIN
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin PROXY_PORT=$port
	ADMIN_PORT=$aport
}

seal_run() {
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN
	PROXY_PID=$SEAL_PID PROXY=$SEAL_PROXY ADMIN=$SEAL_ADMIN
	"$@"
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin
}

# A fourth idemproxy with database.batch = 1 (every claim and record alone):
# ALONE_PID, ALONE_PROXY, ALONE_ADMIN. alone_run ARGS...: proxy_run through
# it.
start_alone_proxy() {
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN port=$PROXY_PORT
	local aport=$ADMIN_PORT
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	CONF_NAME=idemproxy-alone DB_EXTRA="batch = 1;" start_proxy warn
	ALONE_PID=$PROXY_PID ALONE_PROXY=$PROXY ALONE_ADMIN=$ADMIN
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin PROXY_PORT=$port
	ADMIN_PORT=$aport
}

alone_run() {
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN
	PROXY_PID=$ALONE_PID PROXY=$ALONE_PROXY ADMIN=$ALONE_ADMIN
	"$@"
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin
}

# What batching first attempts buys: fresh keys at 16 and WIDE connections
# through the proxy with database.batch = 1 and through the default one,
# interleaved; and the mean batch over them, from the default proxy's
# counters.
batch_runs() {
	local dur=$DUR s c b0 b1
	RECORD=0
	DUR=2
	alone_run proxy_run warmup-alone fresh 16 2
	RECORD=1
	DUR=$(((dur + 1) / 2))
	b0=$(batch_counts)
	for c in 16 ${WIDE:+"$WIDE"}; do
		for s in 1 2; do
			alone_run proxy_run "fresh-c$c-alone" fresh "$c" 2 "" \
				"database.batch = 1 (pair)"
			proxy_run "fresh-c$c-batch" fresh "$c" 2 "" \
				"database.batch = 64 (pair)"
		done
	done
	b1=$(batch_counts)
	echo "$b0 $b1" >"$DATA/batches.txt"
	DUR=$dur
	stub_take
}

# The default proxy's batch counters: claim statements, claims, record
# statements, records.
batch_counts() {
	curl -fsS "$ADMIN/metrics" | awk '
		/^idemproxy_store_batches_total\{kind="claim"\}/ { cs = $2 }
		/^idemproxy_store_batched_total\{kind="claim"\}/ { cn = $2 }
		/^idemproxy_store_batches_total\{kind="record"\}/ { rs = $2 }
		/^idemproxy_store_batched_total\{kind="record"\}/ { rn = $2 }
		END { printf "%d %d %d %d\n", cs, cn, rs, rn }'
}

# Fresh keys and replays with store_encryption on, interleaved with the same
# runs through the proxy without it (their ratio: expected close to 1).
seal_runs() {
	local dur=$DUR s
	RECORD=0
	DUR=2
	seal_run proxy_run warmup-seal fresh 16 2
	RECORD=1
	DUR=$(((dur + 1) / 2))
	for s in 1 2; do
		proxy_run fresh-c16-plain fresh 16 2 "" "encryption off (pair)"
		seal_run proxy_run fresh-c16-seal fresh 16 2 "" "store_encryption on (pair)"
		prime "$TAG-rp-$s"
		proxy_run replay-c16-plain replay 16 2 "$TAG-rp-$s" "encryption off (pair)"
		seal_run prime "$TAG-rs-$s"
		seal_run proxy_run replay-c16-seal replay 16 2 "$TAG-rs-$s" \
			"store_encryption on (pair)"
	done
	DUR=$dur
	stub_take
}

# Fresh keys beside a million tombstones (retain_key, sql/012_tombstones.sql):
# two databases of their own on the same server, one empty, the other
# holding BENCH_TOMBSTONES (default 1,000,000) stripped tombstones of the
# bench's route, each behind its own proxy whose route keeps keys 30 days
# past a 24 h ttl; fresh keys at 16 connections through both, interleaved
# (A B A B). The ratio is what a long retain_key costs a first attempt.
TOMB_PIDS=""
tombstone_runs() {
	local dur=$DUR n=${BENCH_TOMBSTONES:-1000000} db s t0
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN port=$PROXY_PORT
	local aport=$ADMIN_PORT url=$DB_URL e0 e1
	for db in tomb0 tomb1m; do
		psql_q "DROP DATABASE IF EXISTS $db" >/dev/null
		psql_q "CREATE DATABASE $db" >/dev/null
		DB_URL=${url%/*}/$db
		CONF_NAME=idemproxy-$db migrate
	done
	t0=$SECONDS
	psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres -d tomb1m \
		-v n="$n" -f "$HERE/pgbench/tombstones.sql" >"$LOGS/tombstones.log" 2>&1 ||
		{ cat "$LOGS/tombstones.log" >&2; die "writing the tombstones failed"; }
	# The fill's dirty pages are written now, not during the slices.
	checkpoint
	note "tombstones: $n written, vacuumed and checkpointed in $((SECONDS - t0)) s"
	echo "$n" >"$DATA/tombstones.txt"
	DB_URL=${url%/*}/tomb0 start_tomb_proxy tomb0
	e0="$PROXY_PID $PROXY $ADMIN"
	DB_URL=${url%/*}/tomb1m start_tomb_proxy tomb1m
	e1="$PROXY_PID $PROXY $ADMIN"
	DB_URL=$url
	# The warm-ups also bring each store's indexes into the cache and past
	# the full-page writes that follow the checkpoint: fresh keys land all
	# over the million tombstones' primary key (108 MB), and the first
	# slices after the fill measured that, not the steady state.
	RECORD=0
	DUR=8
	# shellcheck disable=SC2086 # e0, e1: three words each
	tomb_run $e0 warmup-tomb0
	# shellcheck disable=SC2086
	tomb_run $e1 warmup-tomb1m
	RECORD=1
	DUR=$(((dur + 1) / 2))
	for s in 1 2; do
		# shellcheck disable=SC2086
		tomb_run $e0 fresh-c16-tomb0 "no tombstones (tombstone pair)"
		# shellcheck disable=SC2086
		tomb_run $e1 fresh-c16-tomb1m "$n tombstones (tombstone pair)"
	done
	DUR=$dur
	for s in $TOMB_PIDS; do
		stop_pid "$s"
	done
	TOMB_PIDS=""
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin PROXY_PORT=$port ADMIN_PORT=$aport
}

# start_tomb_proxy DB: a proxy on DB_URL whose route keeps keys 30 days past
# a 24 h ttl; sets PROXY_PID, PROXY and ADMIN.
start_tomb_proxy() {
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	CONF_NAME=idemproxy-$1 ROUTE_EXTRA='ttl = "24h"; retain_key = "30d";' \
		start_proxy warn
	TOMB_PIDS="$TOMB_PIDS $PROXY_PID"
}

# tomb_run PID URL ADMIN ID [LABEL]: fresh keys at 16 connections through
# one of the tombstone pair's proxies.
tomb_run() {
	local pid=$PROXY_PID proxy=$PROXY admin=$ADMIN
	PROXY_PID=$1 PROXY=$2 ADMIN=$3
	proxy_run "$4" fresh 16 2 "" "${5:-}"
	PROXY_PID=$pid PROXY=$proxy ADMIN=$admin
}

# ---- what the proxy counted ---------------------------------------------

# The sum of idemproxy_requests_total, or of one outcome when given.
requests_total() {
	local outcome=${1:-}
	curl -fsS "$ADMIN/metrics" | awk -v o="$outcome" '
		/^idemproxy_requests_total\{/ {
			if (o == "" || index($0, "outcome=\"" o "\"")) s += $NF
		}
		END { printf "%d\n", s }'
}

# Requests still in flight when wrk stopped finish within milliseconds:
# wait until the counters stand still.
settle() {
	local a b
	a=$(requests_total)
	for _ in $(seq 100); do
		sleep 0.1
		b=$(requests_total)
		[ "$a" = "$b" ] && return 0
		a=$b
	done
	note "idemproxy did not settle"
}

rss_kb() {
	awk '/^VmRSS:/ { print $2 }' "/proc/$PROXY_PID/status"
}

# ---- the rows -----------------------------------------------------------

# A row of the table is one ID: ID.sum holds one "requests duration_us
# errors" line per slice, ID.hist its latencies ("microseconds count").
# report.py turns them into req/s, p50, p99 and mean. Nothing is kept while
# RECORD is 0 (warm-up).
RECORD=1

# register ID SCENARIO TARGET CONNS: the row's label, once.
register() {
	[ "$RECORD" = 1 ] || return 0
	grep -q "^$1	" "$ROWS" 2>/dev/null ||
		printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$ROWS"
}

# wrk_run ID SCENARIO TARGET URL SCRIPT CONNS THREADS TAG: one slice. Sets
# W_REQUESTS, W_STATUS (answers >= 400) and W_ERRORS (all errors).
wrk_run() {
	local id=$1 scenario=$2 target=$3 url=$4 script=$5 conns=$6 threads=$7
	local tag=$8 line hist=/dev/null log=$LOGS/$1.txt
	note "$id: $scenario, $target, $conns connection(s), ${DUR}s"
	[ "$RECORD" = 0 ] || hist=$DATA/$id.hist
	BENCH_HIST=$hist wrk -t"$threads" -c"$conns" -d"${DUR}s" --timeout 10s \
		-s "$HERE/wrk/$script" "$url" -- "$tag" >>"$log" 2>&1 ||
		die "wrk failed (see $log)"
	line=$(grep '^BENCH ' "$log" | tail -n 1 || true)
	[ -n "$line" ] || die "wrk printed no result (see $log)"
	parse_bench "$line"
	W_REQUESTS=$B_requests
	W_STATUS=$B_status
	W_ERRORS=$((B_status + B_connect + B_read + B_write + B_timeout))
	register "$id" "$scenario" "$target" "$conns"
	[ "$RECORD" = 0 ] ||
		echo "$W_REQUESTS $B_duration_us $W_ERRORS" >>"$DATA/$id.sum"
}

# ---- CPU per request ----------------------------------------------------

# cpu_start PG [KIND PID]: the CPU counters before a slice. PG=1 counts
# PostgreSQL (the postmaster and all its children); KIND is "proc" (one
# process and its threads: idemproxy) or "tree" (a process and its
# children: nginx's master and workers), the proxy of the row.
cpu_start() {
	CPU_PG=$1 CPU_KIND=${2:-} CPU_PID=${3:-}
	CPU_HOST0=$(host_ticks)
	CPU_PX0=$(cpu_proxy)
	CPU_PG0=0
	[ "$CPU_PG" = 0 ] || CPU_PG0=$(pg_cpu_s)
}

# PostgreSQL's CPU seconds: every postmaster of PG_PIDS (the three of a
# Citus cluster, citus.sh) and their children, or PG_PID's.
pg_cpu_s() {
	local p t=0
	for p in ${PG_PIDS:-$PG_PID}; do
		t=$(awk -v a="$t" -v b="$(tree_cpu_s "$p")" 'BEGIN { print a + b }')
	done
	echo "$t"
}

cpu_proxy() {
	case "$CPU_KIND" in
	proc) cpu_s "$CPU_PID" ;;
	tree) tree_cpu_s "$CPU_PID" ;;
	*) echo 0 ;;
	esac
}

# The machine's steal time and all its time so far, in ticks summed over
# its CPUs (/proc/stat): "STEAL TOTAL". Steal is the time a virtual
# machine's vCPUs wanted to run and the host ran something else.
host_ticks() {
	awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; print $9 + 0, t; exit }' /proc/stat
}

# cpu_stop ID REQUESTS: appends the slice's "seconds requests" to ID.pgcpu
# (PostgreSQL) and ID.cpu (the proxy), for what cpu_start counted, and
# "STEAL TOTAL" ticks to ID.steal.
cpu_stop() {
	local id=$1 n=$2 px pg=0 host
	px=$(cpu_proxy)
	[ "$CPU_PG" = 0 ] || pg=$(pg_cpu_s)
	host=$(host_ticks)
	[ "$RECORD" = 1 ] || return 0
	echo "$((${host% *} - ${CPU_HOST0% *})) $((${host#* } - ${CPU_HOST0#* }))" >>"$DATA/$id.steal"
	[ "$CPU_PG" = 0 ] ||
		echo "$(awk -v a="$CPU_PG0" -v b="$pg" 'BEGIN { print b - a }') $n" >>"$DATA/$id.pgcpu"
	[ -z "$CPU_KIND" ] ||
		echo "$(awk -v a="$CPU_PX0" -v b="$px" 'BEGIN { print b - a }') $n" >>"$DATA/$id.cpu"
}

# nginx_run ID SCENARIO SCRIPT CONNS THREADS TAG: a slice through nginx,
# counting the CPU of its master and workers.
nginx_run() {
	cpu_start 0 tree "$NGINX_PID"
	wrk_run "$1" "$2" nginx "$NGINX" "$3" "$4" "$5" "$6"
	cpu_stop "$1" "$W_REQUESTS"
}

# What the upstream saw since the last reset (its counts per key in
# STUB_DUMP, for a failed check to show), then a fresh reset.
stub_take() {
	STUB_STATS=$(stub_ctl POST dump)
	stub_ctl POST reset >/dev/null
	parse_stub "$STUB_STATS"
	S_REQUESTS=$S_requests S_KEYS=$S_keys S_MAX=$S_max
	S_DUPS=$S_duplicated_keys S_NOKEY=$S_no_key
}

# A slice through idemproxy, then the proof that nothing was sent twice.
# proxy_run ID KIND(fresh|replay|burst) CONNS THREADS [TAG] [LABEL]
SEQ=0
proxy_run() {
	SEQ=$((SEQ + 1))
	local id=$1 kind=$2 conns=$3 threads=$4 tag=${5:-$TAG-$1-$SEQ}
	local label=${6:-} scenario fwd0 fwd
	case "$kind" in
	fresh) scenario="fresh keys" ;;
	replay) scenario="replays of one key" ;;
	burst) scenario="bursts of 5 duplicates" ;;
	esac
	[ -z "$label" ] || scenario="$scenario, $label"
	stub_take
	fwd0=$(requests_total forwarded)
	local wal0=""
	[ "$kind" != fresh ] || [ "$RECORD" = 0 ] || wal0=$(wal_lsn)
	cpu_start 1 proc "$PROXY_PID"
	wrk_run "$id" "$scenario" idemproxy "$PROXY" "$kind.lua" "$conns" \
		"$threads" "$tag"
	cpu_stop "$id" "$W_REQUESTS"
	settle
	fwd=$(($(requests_total forwarded) - fwd0))
	[ -z "$wal0" ] || wal_since "$id" "$wal0" "$fwd"
	stub_take
	check_exactly_once "$id" "$kind" "$conns" "$fwd"
}

check_exactly_once() {
	local id=$1 kind=$2 conns=$3 fwd=$4
	local what="$id ($kind, $conns conns)" n=${#FAILURES[@]}
	note "$id: upstream saw $STUB_STATS; idemproxy forwarded $fwd"
	[ "$RECORD" = 0 ] || echo "$S_DUPS" >>"$DATA/$id.dups"
	[ "$W_STATUS" = 0 ] || fail "$what: $W_STATUS answers >= 400"
	[ "$S_DUPS" = 0 ] || fail "$what: $S_DUPS keys reached the upstream more than once (max $S_MAX)"
	[ "$S_NOKEY" = 0 ] || fail "$what: $S_NOKEY requests reached the upstream without a key"
	[ "$S_REQUESTS" = "$fwd" ] || fail "$what: idemproxy counted $fwd forwards, the upstream saw $S_REQUESTS requests"
	case "$kind" in
	fresh)
		# Every completed request was a first attempt; up to one per
		# connection was still in flight when wrk stopped.
		[ "$S_KEYS" -ge "$W_REQUESTS" ] && [ "$S_KEYS" -le $((W_REQUESTS + conns)) ] ||
			fail "$what: $W_REQUESTS answers but $S_KEYS keys upstream"
		;;
	burst)
		[ $((S_KEYS * 5)) -ge "$W_REQUESTS" ] &&
			[ $((S_KEYS * 5)) -le $((W_REQUESTS + 10 * conns)) ] ||
			fail "$what: $W_REQUESTS answers but $S_KEYS keys upstream"
		;;
	replay)
		[ "$S_REQUESTS" = 0 ] || fail "$what: a replay reached the upstream"
		;;
	esac
	[ "${#FAILURES[@]}" = "$n" ] && return 0
	cp "$STUB_DUMP" "$LOGS/$id.upstream-counts.txt"
	echo "bench: $id: the keys the upstream saw most often (count, key):" >&2
	sort -rn "$STUB_DUMP" | head -n 5 | sed 's/^/    /' >&2
	echo "bench: all counts: $LOGS/$id.upstream-counts.txt" >&2
}

# Completes the first attempt of KEY so that a run can replay it.
prime() {
	local key=$1 body
	body='{"amount": 1000, "currency": "eur", "description": "bench"}'
	curl -fsS -o /dev/null -X POST "$PROXY/v1/payments" -H "Idempotency-Key: $key" \
		-H 'Content-Type: application/json' -d "$body" ||
		die "priming key $key failed"
	curl -fsS -D - -o /dev/null -X POST "$PROXY/v1/payments" \
		-H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
		-d "$body" | grep -qi '^Idempotent-Replayed: true' ||
		die "key $key is not replayed after its first attempt"
}

# replay_run ID CONNS THREADS [LABEL]: replays of a key primed for this
# slice.
replay_run() {
	SEQ=$((SEQ + 1))
	local key=$TAG-$1-$SEQ
	prime "$key"
	proxy_run "$1" replay "$2" "$3" "$key" "${4:-}"
}

# Replays from the cache at one connection while another client forces
# the heaviest CPU path a request has (heavy_client.py: retries with a
# ~900 KB JSON body, whose canonical form a helper thread makes for each),
# beside the same replays without it, interleaved (A B A B). The heavy
# client's requests are replays too, so the upstream sees none of either.
heavy_runs() {
	local i pid ready=$TMP/heavy.ready stats=$TMP/heavy.stats n=0 e=0 r
	for i in 1 2; do
		replay_run replay-c1-quiet 1 1 "no other client (heavy pair)"
		rm -f "$ready" "$stats"
		"$PYTHON" "$HERE/clients/heavy_client.py" "$PROXY" "$TAG-heavy-$i" \
			"$ready" "$stats" >>"$LOGS/heavy_client.log" 2>&1 &
		pid=$!
		for r in $(seq 100); do
			[ -f "$ready" ] || ! kill -0 "$pid" 2>/dev/null || sleep 0.1
		done
		[ -f "$ready" ] || die "heavy_client did not start (see $LOGS/heavy_client.log)"
		replay_run replay-c1-heavy 1 1 "while a client retries 900 KB JSON bodies (heavy pair)"
		kill -TERM "$pid"
		wait "$pid" || die "heavy_client failed (see $LOGS/heavy_client.log)"
		read -r r i <"$stats"
		n=$((n + r)) e=$((e + i))
	done
	[ "$e" = 0 ] || fail "heavy pair: $e of the heavy client's $n requests failed"
	[ "$RECORD" = 0 ] || echo "$n" >"$DATA/heavy_requests.txt"
	note "heavy pair: the heavy client's requests during the slices: $n"
}

psql_q() {
	psql -X -qAt -F ' ' -h 127.0.0.1 -p "$PGPORT" -U postgres -d idemproxy -c "$1"
}

# Records in the store, and those not completed, as "ALL NOT_COMPLETED".
store_counts() {
	psql_q "SELECT count(*), count(*) FILTER (WHERE state <> 'completed')
		  FROM idempotency_records"
}

# The same for the raw pair's table.
raw_counts() {
	psql_q "SELECT count(*), count(*) FILTER (WHERE status IS NULL)
		  FROM bench_raw_pair"
}

# pgbench_pair ID CONNS SCRIPT COUNTS SCENARIO: one slice of a script
# whose every transaction writes a new row and completes it (COUNTS names
# the function counting them), and the check that each did. Each slice
# gets its own -D run, which keeps its keys apart from every other's.
PG_RUN=0
pgbench_pair() {
	local id=$1 conns=$2 script=$3 counts=$4 scenario=$5 before after
	PG_RUN=$((PG_RUN + 1))
	before=$($counts)
	local wal0=""
	[ "$RECORD" = 0 ] || wal0=$(wal_lsn)
	pgbench_exec "$id" "$conns" "$script" -D run="$PG_RUN" -D n=0
	[ -z "$wal0" ] || wal_since "$id" "$wal0" "$P_N"
	after=$($counts)
	local new=$((${after% *} - ${before% *})) open=$((${after#* } - ${before#* }))
	note "$id: $P_N transactions, $new new rows, $open left open"
	[ "$new" -ge "$P_N" ] && [ "$open" = 0 ] ||
		fail "$id: $P_N transactions made $new rows, $open of them not completed"
	register "$id" "$scenario" pgbench "$conns"
}

# pgbench_run ID CONNS: the claim and record statements of a first attempt.
pgbench_run() {
	pgbench_pair "$1" "$2" claim_record.sql store_counts "claim+record (pgbench)"
}

# raw_run ID CONNS: the raw two-commit pair on a table with only its
# primary key (raw_pair.sql): the store's limit, whatever its schema.
raw_run() {
	pgbench_pair "$1" "$2" raw_pair.sql raw_counts "raw two-commit pair (pgbench)"
}

# pgbench_replay_run ID CONNS: the claim of a replay of a key that
# claim_record.sql completed (its hash is that script's constant).
pgbench_replay_run() {
	local key
	key=$(psql -X -qAt -h 127.0.0.1 -p "$PGPORT" -U postgres -d idemproxy -c \
		"SELECT idem_key FROM idempotency_records
		  WHERE state = 'completed' AND operation = 'create_payment'
		    AND request_hash = '\\x9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'
		  LIMIT 1")
	[ -n "$key" ] || die "no completed record to replay"
	pgbench_exec "$1" "$2" replay_claim.sql -D key="$key"
	register "$1" "replay claim (pgbench)" pgbench "$2"
}

# PostgreSQL's client backends (the proxies' and pgbench's), live.
client_backends() {
	pgrep -c -P "$PG_PID" -f '^postgres: postgres ' || true
}

# pgbench_exec ID CONNS SCRIPT [ARGS...]: one slice, with PostgreSQL's CPU
# per transaction; sets P_N.
pgbench_exec() {
	local id=$1 conns=$2 script=$3 log=$LOGS/$1.txt threads failed tps
	shift 3
	threads=$((conns < 2 ? conns : 2))
	note "$id: $script, pgbench, $conns client(s), ${DUR}s"
	rm -f "$TMP"/pgb.*
	local backends t0 i
	backends=$(client_backends)
	(cd "$TMP" && exec pgbench -h 127.0.0.1 -p "$PGPORT" -U postgres -n \
		-M prepared -c "$conns" -j "$threads" -T "$DUR" "$@" \
		-f "$ROOT/$HERE/pgbench/$script" -l --log-prefix=pgb idemproxy) \
		>>"$log" 2>&1 &
	PGB_PID=$!
	# PostgreSQL's CPU is counted from 0.2 s after pgbench's clients have
	# connected, over the transactions that ended after that: forking the
	# backends and their first statements (planning, compiling PL/pgSQL)
	# are not a claim's cost; the proxy's backends live for its lifetime.
	for i in $(seq 100); do
		[ "$(client_backends)" -ge $((backends + conns)) ] && break
		sleep 0.05
	done
	[ "$i" -lt 100 ] || note "$id: pgbench's clients did not all connect within 5 s"
	sleep 0.2
	t0=$(date +%s%6N)
	cpu_start 1
	# pgbench's own CPU (the C client sending the same statements, its
	# connections driven by one event loop per thread), sampled until it
	# exits: the last sample and the transactions that ended before it.
	local sampler=$TMP/pgb-cpu.txt
	(while c=$(cpu_s "$PGB_PID" 2>/dev/null); do
		echo "$(date +%s%6N) $c"
		sleep 0.05
	done) >"$sampler" &
	local sampler_pid=$!
	wait "$PGB_PID" || die "pgbench failed (see $log)"
	PGB_PID=""
	wait "$sampler_pid" 2>/dev/null || true
	# pgbench's backends finish exiting after it: count their exit too.
	for _ in $(seq 50); do
		[ "$(client_backends)" -le "$backends" ] && break
		sleep 0.1
	done
	cpu_stop "$id" "$(cat "$TMP"/pgb.* | awk -v t0="$t0" '$5 * 1000000 + $6 >= t0 { n++ } END { print n + 0 }')"
	local first last
	first=$(grep -E '^[0-9]+ [0-9.]+$' "$sampler" | head -n 1)
	last=$(grep -E '^[0-9]+ [0-9.]+$' "$sampler" | tail -n 1)
	if [ "$RECORD" = 1 ] && [ -n "$first" ] && [ "$first" != "$last" ]; then
		echo "$(awk -v a="${first#* }" -v b="${last#* }" 'BEGIN { print b - a }') $(cat "$TMP"/pgb.* |
			awk -v t0="${first% *}" -v t1="${last% *}" '{ t = $5 * 1000000 + $6 } t >= t0 && t <= t1 { n++ } END { print n + 0 }')" \
			>>"$DATA/$id.cpu"
	fi
	P_N=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log" | tail -n 1)
	failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$log" | tail -n 1)
	tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | tail -n 1)
	[ -n "$P_N" ] && [ -n "$tps" ] || die "cannot read pgbench's result (see $log)"
	[ "${failed:-0}" = 0 ] || fail "$id: pgbench had $failed failed transactions"
	[ "$RECORD" = 1 ] || return 0
	# The time the transactions took, without pgbench's connection set-up
	# (forking 16 backends is not the store's throughput).
	echo "$P_N $(awk -v n="$P_N" -v t="$tps" 'BEGIN { printf "%.0f", n / t * 1e6 }') ${failed:-0}" \
		>>"$DATA/$id.sum"
	# The per-transaction log's third column is the latency in microseconds.
	cat "$TMP"/pgb.* | awk '{ print $3, 1 }' >>"$DATA/$id.hist"
}

# ---- the memory check ---------------------------------------------------

# idemproxy_replay_cache_bytes now.
cache_bytes() {
	curl -fsS "$ADMIN/metrics" | awk '/^idemproxy_replay_cache_bytes / { print $NF }'
}

# A fresh idemproxy under the mixed load; after RSS_WARM_S seconds of it
# (the replay cache holds replay_cache_ttl's worth of answers, 10 s: until
# then it grows by design, with the rate), VmRSS and the cache's bytes when
# the request counter has passed each of RSS_COUNTS more.
rss_run() {
	local tag=$TAG-mix targets=($RSS_COUNTS) i=0 total rss fwd0 fwd pass0 pass base t0
	restart_proxy warn
	prime "$tag-hot"
	stub_take
	fwd0=$(requests_total forwarded)
	pass0=$(requests_total passthrough)
	note "rss: mixed load, 16 connections, ${RSS_WARM_S}s, then until ${targets[-1]} requests more (at most ${RSS_MAX_S}s)"
	: >"$DATA/rss.tsv"
	wrk -t2 -c16 -d"$((RSS_WARM_S + RSS_MAX_S))s" --timeout 10s -s "$HERE/wrk/mixed.lua" \
		"$PROXY" -- "$tag" >"$LOGS/rss.txt" 2>&1 &
	WRK_PID=$!
	t0=$SECONDS
	while kill -0 "$WRK_PID" 2>/dev/null && [ $((SECONDS - t0)) -lt "$RSS_WARM_S" ]; do
		sleep 0.1
	done
	base=$(requests_total)
	rss=$(rss_kb)
	printf 'warm\t%s\t%s\t%s\n' "$base" "$rss" "$(cache_bytes)" >"$DATA/rss-warm.tsv"
	note "rss: $rss kB after ${RSS_WARM_S}s ($base requests); counting from here"
	while kill -0 "$WRK_PID" 2>/dev/null && [ "$i" -lt "${#targets[@]}" ]; do
		total=$(($(requests_total) - base))
		if [ "$total" -ge "${targets[$i]}" ]; then
			rss=$(rss_kb)
			printf '%s\t%s\t%s\t%s\n' "${targets[$i]}" "$total" "$rss" "$(cache_bytes)" >>"$DATA/rss.tsv"
			note "rss: $rss kB after $total requests more"
			i=$((i + 1))
			continue
		fi
		sleep 0.1
	done
	stop_pid "$WRK_PID" INT
	WRK_PID=""
	settle
	fwd=$(($(requests_total forwarded) - fwd0))
	pass=$(($(requests_total passthrough) - pass0))
	stub_take
	note "rss: upstream saw $STUB_STATS; idemproxy forwarded $fwd, passed $pass through"
	echo "$S_DUPS" >>"$DATA/rss.dups"
	[ "$S_DUPS" = 0 ] || fail "rss: $S_DUPS keys reached the upstream more than once (max $S_MAX)"
	[ "$S_KEYS" = "$fwd" ] || fail "rss: idemproxy counted $fwd forwards, the upstream saw $S_KEYS keys"
	[ "$S_NOKEY" = "$pass" ] || fail "rss: idemproxy passed $pass requests through, the upstream saw $S_NOKEY without a key"
	[ "$i" -eq "${#targets[@]}" ] ||
		note "rss: only $(($(requests_total) - base)) requests in ${RSS_MAX_S}s after the warm-up"
}

# The server's WAL position now.
wal_lsn() {
	psql_q "SELECT pg_current_wal_lsn()"
}

# wal_since ID LSN N: the WAL written since LSN, for N requests (fresh
# keys: the forwards, each a claim and a record), into DATA/ID.wal.
wal_since() {
	[ "$RECORD" = 1 ] && [ "${3:-0}" -gt 0 ] || return 0
	echo "$(psql_q "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$2')::bigint") $3" >>"$DATA/$1.wal"
}

# The server's checkpoints so far (timed and requested).
checkpoints() {
	psql_q "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
}

checkpoint() {
	psql_q CHECKPOINT >/dev/null || die "CHECKPOINT failed"
}

# What a checkpoint costs: the raw pair and idemproxy at 16 connections,
# each half right after a CHECKPOINT, A B A B. Last, so that no other row
# pays for the pages these leave to be written again.
checkpoint_runs() {
	local dur=$DUR s
	DUR=$(((dur + 1) / 2))
	for s in 1 2; do
		checkpoint
		pgbench_pair raw-c16-ckpt 16 raw_pair.sql raw_counts \
			"raw two-commit pair (pgbench), just after a CHECKPOINT"
		checkpoint
		proxy_run fresh-c16-ckpt fresh 16 2 "" "just after a CHECKPOINT"
	done
	DUR=$dur
}

# ---- main ---------------------------------------------------------------

warm_up() {
	local dur=$DUR
	DUR=2
	RECORD=0
	proxy_run warmup fresh 16 2
	busy_run warmup-busy fresh 1 1
	nginx_run warmup-nginx "warm-up" fresh.lua 16 2 "$TAG-wn"
	raw_run warmup-raw 16
	RECORD=1
	DUR=$dur
	stub_take
}

# The rows whose ratios are targets, in interleaved halves: at one
# connection (latency), at 16 and WIDE (throughput and CPU per request:
# the raw pair, the project's own statements and idemproxy side by side),
# and replays.
target_runs() {
	local dur=$DUR s
	DUR=$(((dur + 1) / 2))
	for s in 1 2; do
		wrk_run direct-c1 "fresh keys, no proxy" "stub (direct)" "$STUB" fresh.lua 1 1 "$TAG-d1-$s"
		raw_run raw-c1 1
		pgbench_run pgbench-c1 1
		proxy_run fresh-c1 fresh 1 1
		busy_run fresh-c1-busy fresh 1 1 "" "busy_poll $BUSY"
	done
	# 16 then WIDE, then WIDE then 16: the table grows with every run, so
	# neither concurrency always meets the larger one.
	for s in 16 "$WIDE" "$WIDE" 16; do
		[ -n "$s" ] || continue
		raw_run "raw-c$s" "$s"
		pgbench_run "pgbench-c$s" "$s"
		proxy_run "fresh-c$s" fresh "$s" 2
	done
	stub_take
	for s in 1 2; do
		nginx_run nginx-replay-c16 "replays of one key" replay.lua 16 2 "$TAG-nr16"
		replay_run replay-c16 16 2
		# The store's own limit for replays.
		pgbench_replay_run pgbench-replay-c16 16
	done
	DUR=$dur
}

other_runs() {
	nginx_run nginx-fresh-c1 "fresh keys" fresh.lua 1 1 "$TAG-n1"
	nginx_run nginx-fresh-c16 "fresh keys" fresh.lua 16 2 "$TAG-n16"
	replay_run replay-c1 1 1
	# One connection per wrk thread, so a burst is in a row per connection.
	proxy_run burst-c1 burst 1 1
	proxy_run burst-c16 burst 16 16
	[ -z "$WIDE" ] || replay_run "replay-c$WIDE" "$WIDE" 2
	stub_take
	# Duplicates that wait (in_flight = "wait"): its own upstream and proxy;
	# every key must reach the upstream exactly once.
	"$PYTHON" "$HERE/clients/wait_burst.py" "$BIN/idemproxy" "$DB_URL" 20 50 \
		"$DATA/wait_burst.md" >"$LOGS/wait_burst.log" 2>&1 ||
		fail "wait-burst: $(tail -n 1 "$LOGS/wait_burst.log")"
}

main() {
	for tool in wrk nginx pgbench psql curl; do
		command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run \`make bench-deps\`"
	done
	[ -x "$BIN/idemproxy" ] && [ -x "$BIN/stub_upstream" ] && [ -x "$BIN/wake_cost" ] ||
		die "run \`make bench\` (it builds $BIN first)"
	rm -rf "$LOGS" "$DATA"
	rm -f "$OUT/results.md"
	mkdir -p "$LOGS" "$DATA"
	TMP=$(mktemp -d /tmp/idemproxy-bench.XXXXXX)
	# PostgreSQL runs as postgres and nginx's workers drop root: both must
	# reach their directories inside.
	chmod 755 "$TMP"
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
	note "machine: $(nproc) cpus, load average $LOAD_START"
	# What one wake-up costs here, before anything else runs.
	"$BIN/wake_cost" 1 >"$DATA/wake.txt" || die "wake_cost failed"
	note "wake-ups: $(cat "$DATA/wake.txt")"
	# Production-like durability: every commit waits for its WAL flush.
	# No checkpoint of its own inside the run (one is forced after the
	# warm-up, and two rows measure the cost of one): the full-page
	# writes after a checkpoint double the WAL per request for the next
	# seconds, and would land in one row and not in the row it is
	# compared with.
	start_pg "-c fsync=on -c synchronous_commit=on -c full_page_writes=on -c max_wal_size=16GB -c checkpoint_timeout=1h"
	start_stub
	start_nginx
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	PG_PID=$(pg_pid)
	migrate
	psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres \
		-d idemproxy -f "$HERE/pgbench/raw_pair_table.sql" >"$LOGS/raw_pair_table.log" 2>&1 ||
		{ cat "$LOGS/raw_pair_table.log" >&2; die "creating the raw pair's table failed"; }
	start_proxy warn
	start_busy_proxy
	start_seal_proxy
	start_alone_proxy
	note "postgres :$PGPORT, stub :$STUB_PORT, nginx :$NGINX_PORT, idemproxy :$PROXY_PORT (admin :$ADMIN_PORT), $WORKERS workers; with busy_poll $BUSY: $BUSY_PROXY"

	# BENCH_ONLY="heavy_runs ...": only those runs, after the start-up
	# (no warm-up, no targets); the table has only their rows.
	if [ -n "${BENCH_ONLY:-}" ]; then
		local f
		for f in $BENCH_ONLY; do
			"$f"
		done
		report
		return
	fi
	warm_up
	checkpoint
	local ck0
	ck0=$(checkpoints)
	target_runs
	other_runs
	seal_runs
	batch_runs
	tombstone_runs
	rss_run
	# What a log line per request costs: the same run at both levels, back
	# to back on the process the memory check warmed up.
	proxy_run fresh-c16-warn fresh 16 2 "$TAG-warn" "log_level warn (pair)"
	set_log_level info
	proxy_run fresh-c16-info fresh 16 2 "$TAG-info" "log_level info (pair)"
	set_log_level warn
	echo "$(($(checkpoints) - ck0))" >"$DATA/checkpoints.txt"
	checkpoint_runs
	heavy_runs
	report
}

report() {
	local elapsed=$((SECONDS - START_S))
	"$PYTHON" "$HERE/report/report.py" --data "$DATA" --out "$OUT/results.md" \
		--workers "$WORKERS" --duration "$DUR" --elapsed "$elapsed" \
		--busy "$BUSY" --wide "$WIDE" --cpus "$(nproc)" --load "$LOAD_START / $(cut -d' ' -f1-3 /proc/loadavg)" \
		--failures "$(printf '%s\n' "${FAILURES[@]+"${FAILURES[@]}"}")" \
		--only "${BENCH_ONLY:-}"
	if [ -f "$DATA/wait_burst.md" ]; then
		printf '\n| waiting duplicates | exactly once | latency |\n|---|---|---|\n' >>"$OUT/results.md"
		cat "$DATA/wait_burst.md" >>"$OUT/results.md"
	fi
	if [ "${#FAILURES[@]}" -gt 0 ]; then
		echo >&2
		for f in "${FAILURES[@]}"; do
			echo "bench: CHECK FAILED: $f" >&2
		done
		die "${#FAILURES[@]} check(s) failed"
	fi
}

# citus.sh sources this file for its functions.
[ -n "${BENCH_SOURCE_ONLY:-}" ] || main "$@"
