# Helpers shared by run.sh (`make bench`) and profile.sh
# (`make bench-profile`); sourced, with ROOT as the working directory and
# BIN, OUT, LOGS, HERE, TMP and PYTHON set.

die() {
	echo "bench: $*" >&2
	exit 1
}

note() {
	printf 'bench: [%3ds] %s\n' $((SECONDS - START_S)) "$*" >&2
}

stop_pid() {
	local pid=$1 sig=${2:-TERM}
	[ -n "$pid" ] || return 0
	kill "-$sig" "$pid" 2>/dev/null || return 0
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

free_port() {
	"$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_http URL WHAT [TENTHS]: until URL answers 2xx (default 10 s).
wait_http() {
	local url=$1 what=$2
	for _ in $(seq "${3:-100}"); do
		curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
		sleep 0.1
	done
	die "$what did not answer at $url"
}

# ---- the services -------------------------------------------------------

# start_pg SETTINGS: a cluster in TMP/pg with these server settings; sets
# PG_DIR, PGPORT and DB_URL.
start_pg() {
	PG_DIR=$TMP/pg
	export PGPORT
	PGPORT=$(free_port)
	DB_URL=$(PG_LOCAL_OPTS="$1 -c max_connections=300" \
		scripts/pg-local.sh start "$PG_DIR" 2>"$LOGS/pg-local.log") ||
		{ cat "$LOGS/pg-local.log" >&2; die "PostgreSQL did not start"; }
}

# Sets STUB_PID, STUB_PORT, STUB and STUB_DUMP (where POST /__stub/dump
# writes the counts per key).
start_stub() {
	STUB_DUMP=$TMP/upstream-counts.txt
	"$BIN/stub_upstream" --threads 2 --dump "$STUB_DUMP" \
		>"$TMP/stub.out" 2>"$LOGS/stub.log" &
	STUB_PID=$!
	STUB_PORT=$(first_line "$TMP/stub.out")
	[ -n "$STUB_PORT" ] || die "the stub upstream did not start (see $LOGS/stub.log)"
	STUB=http://127.0.0.1:$STUB_PORT
}

# first_line FILE: its first line, once a process has written it (within
# 5 s); empty if none came.
first_line() {
	for _ in $(seq 50); do
		[ -s "$1" ] && break
		sleep 0.1
	done
	head -n 1 "$1" 2>/dev/null || true
}

stub_ctl() {
	local method=$1 what=$2
	curl -fsS -X "$method" "$STUB/__stub/$what"
}

# One file per proxy (CONF_NAME), so that a SIGHUP makes the running proxy
# read a new level; BUSY_POLL sets busy_poll (default off); EXTRA_CONF is
# appended as it is; DB_EXTRA and ROUTE_EXTRA are settings added to the
# database group and to the route (citus.sh); CONF_IN is the template
# (ab.sh: the base revision's own).
write_conf() {
	local level=$1 conf=$TMP/${CONF_NAME:-idemproxy}.conf
	sed -e "s#@LISTEN@#127.0.0.1:$PROXY_PORT#" \
		-e "s/@BUSY_POLL@/${BUSY_POLL:-0ms}/" \
		-e "s#@ADMIN@#127.0.0.1:$ADMIN_PORT#" \
		-e "s#@DB_URL@#$DB_URL#" -e "s#@UPSTREAM@#$STUB#" \
		-e "s/@WORKERS@/$WORKERS/" -e "s/@LOG_LEVEL@/$level/" \
		-e "s/@DB_EXTRA@/${DB_EXTRA:-}/" -e "s/@ROUTE_EXTRA@/${ROUTE_EXTRA:-}/" \
		"${CONF_IN:-$HERE/conf/idemproxy.conf.in}" >"$conf"
	[ -z "${EXTRA_CONF:-}" ] || printf '%s\n' "$EXTRA_CONF" >>"$conf"
	echo "$conf"
}

# start_proxy LEVEL [WRAPPER...]: idemproxy on PROXY_PORT (admin
# ADMIN_PORT), under WRAPPER (valgrind) when given; sets PROXY_PID, PROXY and
# ADMIN.
start_proxy() {
	local level=$1 conf
	shift
	conf=$(write_conf "$level")
	"$BIN/idemproxy" -c "$conf" --check >/dev/null || die "$conf does not pass --check"
	"$@" "$BIN/idemproxy" -c "$conf" 2>>"$LOGS/idemproxy.log" &
	PROXY_PID=$!
	PROXY=http://127.0.0.1:$PROXY_PORT
	ADMIN=http://127.0.0.1:$ADMIN_PORT
	wait_http "$ADMIN/readyz" idemproxy "${PROXY_WAIT_TENTHS:-100}"
}

migrate() {
	"$BIN/idemproxy" -c "$(write_conf warn)" --migrate >"$LOGS/migrate.log" 2>&1 ||
		{ cat "$LOGS/migrate.log" >&2; die "idemproxy --migrate failed"; }
}


# ---- CPU time -----------------------------------------------------------

# cpu_s PID: user + system CPU seconds of PID (all its threads, live and
# exited) so far.
cpu_s() {
	awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / hz }' \
		"/proc/$1/stat"
}

# tree_cpu_s PID: the CPU seconds of PID and of all its children, live and
# exited: PID's utime + stime + cutime + cstime (its exited children, once
# reaped) plus the utime + stime of its live children. For the postmaster
# that is PostgreSQL's whole cost: every backend and background process.
# The children are read before the parent, so a child that exits in
# between is counted twice (never lost) only if it is reaped in that
# window, and readings after a run wait for the reaping (wait_children).
tree_cpu_s() {
	local pid=$1
	# shellcheck disable=SC2046
	awk -v hz="$(getconf CLK_TCK)" -v root="$pid" '
		function ticks(p, self,   f, line, a) {
			f = "/proc/" p "/stat"
			if ((getline line < f) <= 0)
				return 0
			close(f)
			sub(/.*\) /, "", line)
			split(line, a, " ")
			return a[12] + a[13] + (self ? a[14] + a[15] : 0)
		}
		BEGIN {
			for (i = 1; i < ARGC; i++)
				t += ticks(ARGV[i], 0)
			t += ticks(root, 1)
			print t / hz
		}' $(ps -o pid= --ppid "$pid")
}

# children PID: how many live children PID has.
children() {
	ps -o pid= --ppid "$1" | wc -l
}

# wait_children PID N: until PID has at most N children (its exited
# children reaped, so that their time is in its cutime), at most 5 s.
wait_children() {
	for _ in $(seq 50); do
		[ "$(children "$1")" -le "$2" ] && return 0
		sleep 0.1
	done
	note "$(children "$1") children of $1 still running (wanted $2)"
}

# The postmaster's pid (after start_pg).
pg_pid() {
	head -n 1 "$PG_DIR/data/postmaster.pid"
}

# variant_db DB SCHEMA[,SCHEMA...]: creates DB and applies the SCHEMA files
# in order; "-" stands for sql/*.sql, the migrations (ab_store.sh,
# cg_store.sh).
variant_db() {
	local db=$1 f s
	psql -X -qAt -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -c "CREATE DATABASE $db" >/dev/null
	for f in ${2//,/ }; do
		if [ "$f" = - ]; then
			for s in sql/*.sql; do
				# 003 needs the table the binary writes first.
				[ "${s##*/}" != 003_tenant_sources.sql ] ||
					psql -X -qAt -h 127.0.0.1 -p "$PGPORT" -U postgres -d "$db" -c "CREATE TABLE idemproxy_tenant_sources_003 (operation text, source text)" >/dev/null
				psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres -d "$db" -f "$s" >/dev/null
			done
		else
			psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres -d "$db" -f "$f" >/dev/null
		fi
	done
}

# Sets B_NAME for each NAME=value of a wrk result line (without forking:
# on a loaded machine every process costs tens of milliseconds).
parse_bench() {
	local kv
	for kv in ${1#BENCH }; do
		printf -v "B_${kv%%=*}" '%s' "${kv#*=}"
	done
}

# Sets S_NAME for each "NAME":number of the stub's flat JSON object.
parse_stub() {
	local s=${1//[\{\}\"]/} kv parts
	IFS=, read -ra parts <<<"$s"
	for kv in "${parts[@]}"; do
		printf -v "S_${kv%%:*}" '%s' "${kv#*:}"
	done
}
