#!/usr/bin/env bash
# A/B of store variants: the same pgbench script shape against two (or more)
# schemas in one PostgreSQL (fsync, synchronous_commit and full_page_writes
# on), their slices interleaved (A B A B ...), each starting right after a
# CHECKPOINT so that every slice pays the same full-page writes. Per variant:
# tps, PostgreSQL CPU per transaction (the postmaster and all its children,
# as make bench counts it), WAL bytes per transaction, and the share of
# UPDATEs that were HOT. Machine load drifts; CPU and WAL per transaction
# are what to compare.
#
#   tests/bench/ab_store.sh NAME=SCHEMA[,SCHEMA...]:SCRIPT ...
#
# SCHEMA files are applied in order to the variant's own database (after
# sql/*.sql when the first one is "-"); SCRIPT is a pgbench script run with
# -M prepared -D run=N -D n=0 (as make bench runs claim_record.sql).
# Environment: AB_ROUNDS (3), AB_SECONDS (5), AB_CLIENTS (16).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
OUT=${BENCH_OUT:-build-bench}
LOGS=$OUT/logs/ab
HERE=tests/bench
PYTHON=/usr/bin/python3
ROUNDS=${AB_ROUNDS:-3}
SECS=${AB_SECONDS:-5}
CLIENTS=${AB_CLIENTS:-16}
START_S=$SECONDS
TMP=""
PG_DIR=""

# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

cleanup() {
	local rc=$?
	set +e
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

q() {
	psql -X -qAt -h 127.0.0.1 -p "$PGPORT" -U postgres -d "$1" -c "$2"
}

main() {
	[ "$#" -ge 1 ] || die "usage: $0 NAME=SCHEMA[,SCHEMA...]:SCRIPT ..."
	mkdir -p "$LOGS"
	TMP=$(mktemp -d /tmp/idemproxy-ab.XXXXXX)
	chmod 755 "$TMP"
	trap cleanup EXIT
	start_pg "-c fsync=on -c synchronous_commit=on -c full_page_writes=on -c max_wal_size=8GB -c checkpoint_timeout=1h"
	local pg
	pg=$(pg_pid)
	local names=() v name schemas script
	for v in "$@"; do
		name=${v%%=*}
		schemas=${v#*=}
		script=${schemas##*:}
		schemas=${schemas%:*}
		names+=("$name")
		printf -v "SCRIPT_$name" '%s' "$script"
		variant_db "ab_$name" "$schemas"
	done
	local r run=0 c0 c1 w0 w1 u0 u1 h0 h1 n log
	: >"$TMP/res"
	for r in $(seq "$ROUNDS"); do
		for name in "${names[@]}"; do
			run=$((run + 1))
			script=SCRIPT_$name
			log=$LOGS/$name.txt
			q idemproxy CHECKPOINT >/dev/null
			read -r u0 h0 < <(q "ab_$name" "SELECT coalesce(sum(n_tup_upd),0), coalesce(sum(n_tup_hot_upd),0) FROM pg_stat_user_tables" | tr '|' ' ')
			w0=$(q idemproxy "SELECT pg_current_wal_lsn() - '0/0'")
			c0=$(tree_cpu_s "$pg")
			pgbench -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared \
				-c "$CLIENTS" -j 2 -T "$SECS" -D run="$run" -D n=0 \
				-f "$(realpath "${!script}")" "ab_$name" >"$log" 2>&1 || { cat "$log" >&2; die "pgbench failed"; }
			wait_children "$pg" 8
			c1=$(tree_cpu_s "$pg")
			w1=$(q idemproxy "SELECT pg_current_wal_lsn() - '0/0'")
			sleep 0.6
			read -r u1 h1 < <(q "ab_$name" "SELECT coalesce(sum(n_tup_upd),0), coalesce(sum(n_tup_hot_upd),0) FROM pg_stat_user_tables" | tr '|' ' ')
			n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
			echo "$name $n $SECS $c0 $c1 $w0 $w1 $u0 $u1 $h0 $h1" >>"$TMP/res"
			note "$name round $r: $n transactions"
		done
	done
	awk '
		{ n[$1] += $2; t[$1] += $3; cpu[$1] += $5 - $4; wal[$1] += $7 - $6
		  upd[$1] += $9 - $8; hot[$1] += $11 - $10
		  if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
		END {
			printf "%-16s %8s %12s %12s %8s\n", "variant", "tps", "PG CPU/tx", "WAL B/tx", "HOT"
			for (i = 1; i <= k; i++) { v = order[i]
				printf "%-16s %8.0f %10.1f us %12.0f %7.0f%%\n", v, n[v] / t[v],
					cpu[v] / n[v] * 1e6, wal[v] / n[v], upd[v] ? hot[v] / upd[v] * 100 : 0 }
		}' "$TMP/res" | tee "$LOGS/summary.txt"
}

main "$@"
