#!/usr/bin/env bash
# Instructions PostgreSQL's backend executes per transaction, for store
# variants: the same shape as ab_store.sh, but counted by callgrind, so the
# figures do not depend on the machine's load and repeat exactly. The
# server runs under valgrind (--trace-children: every backend gets its own
# count); each variant's script runs twice from one pgbench client
# (-M prepared, as the proxy prepares its statements), for CG_SHORT and
# CG_LONG transactions, and the difference of the two backends' counts,
# over CG_LONG - CG_SHORT, is the cost of a transaction without the
# connection's start and end. fsync is off: the instructions are the same,
# only the waits differ. The kernel's work (network, fsync) is not counted.
#
#   tests/bench/cg_store.sh NAME=SCHEMA[,SCHEMA...]:SCRIPT ...
#
# SCHEMA and SCRIPT as for ab_store.sh. Environment: CG_SHORT (200),
# CG_LONG (1200). About a minute per variant.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
OUT=${BENCH_OUT:-build-bench}
LOGS=$OUT/logs/cg
HERE=tests/bench
PYTHON=/usr/bin/python3
SHORT=${CG_SHORT:-200}
LONG=${CG_LONG:-1200}
START_S=$SECONDS
TMP=""
PG_DIR=""
VG_PID=""

# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

cleanup() {
	local rc=$?
	set +e
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	[ -z "$VG_PID" ] || wait "$VG_PID" 2>/dev/null
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

# The count of the newest backend: the largest callgrind file written since
# the marker file.
newest_count() {
	find "$TMP/cg" -name 'cg.*' -newer "$TMP/mark" -print0 |
		xargs -0 -r grep -h -m1 '^summary:' | awk '$2 > m { m = $2 } END { print m + 0 }'
}

run_count() {
	local db=$1 script=$2 n=$3 log=$4 run=$5
	touch "$TMP/mark"
	sleep 1 # the marker's mtime must be older than the backend's file
	pgbench -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -c 1 -t "$n" \
		-D run="$run" -D n=0 -f "$(realpath "$script")" "$db" >"$log" 2>&1 ||
		{ cat "$log" >&2; die "pgbench failed"; }
	# The backend writes its count when it exits, after pgbench does:
	# wait until the new counts stop changing.
	local c prev=-1
	for _ in $(seq 60); do
		sleep 1
		c=$(newest_count)
		[ "$c" -gt 0 ] && [ "$c" = "$prev" ] && break
		prev=$c
	done
	echo "$c"
}

main() {
	[ "$#" -ge 1 ] || die "usage: $0 NAME=SCHEMA[,SCHEMA...]:SCRIPT ..."
	command -v valgrind >/dev/null || die "valgrind is needed"
	mkdir -p "$LOGS"
	TMP=$(mktemp -d /tmp/idemproxy-cg.XXXXXX)
	chmod 755 "$TMP"
	trap cleanup EXIT
	start_pg "-c fsync=off -c autovacuum=off"
	local v name schemas script names=()
	for v in "$@"; do
		name=${v%%=*}
		schemas=${v#*=}
		script=${schemas##*:}
		schemas=${schemas%:*}
		names+=("$name")
		printf -v "SCRIPT_$name" '%s' "$script"
		variant_db "cg_$name" "$schemas"
	done
	# The same cluster again, under callgrind.
	local bindir cmd
	bindir=$(dirname "$(readlink -f "/proc/$(pg_pid)/exe")")
	cmd=$(tr '\0' ' ' <"/proc/$(pg_pid)/cmdline")
	scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	mkdir -p "$TMP/cg"
	chown postgres "$TMP/cg" 2>/dev/null || true
	# shellcheck disable=SC2086 # the server's own arguments, as it ran
	runuser -u postgres -- valgrind --tool=callgrind --trace-children=yes \
		--callgrind-out-file="$TMP/cg/cg.%p" "$bindir/postgres" ${cmd#* } \
		>"$LOGS/valgrind.log" 2>&1 &
	VG_PID=$!
	for _ in $(seq 120); do
		psql -X -qAt -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -c "SELECT 1" >/dev/null 2>&1 && break
		sleep 0.5
	done
	local s l run=0
	printf '%-16s %14s\n' variant "Ir per tx" | tee "$LOGS/summary.txt"
	for name in "${names[@]}"; do
		script=SCRIPT_$name
		run=$((run + 2))
		s=$(run_count "cg_$name" "${!script}" "$SHORT" "$LOGS/$name.short.txt" $((run - 1)))
		l=$(run_count "cg_$name" "${!script}" "$LONG" "$LOGS/$name.long.txt" "$run")
		printf '%-16s %14.0f\n' "$name" "$(( (l - s) / (LONG - SHORT) ))" | tee -a "$LOGS/summary.txt"
	done
	note "done in $((SECONDS - START_S)) s"
}

main "$@"
