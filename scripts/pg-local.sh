#!/usr/bin/env bash
# A throwaway PostgreSQL cluster that lives in one directory.
#
#   pg-local.sh start  DIR [DB]  create the cluster if DIR has none, start it,
#                                create database DB (default idemproxy), and
#                                print its URL on stdout
#   pg-local.sh stop   DIR       stop it (nothing to do when it is not running)
#   pg-local.sh url    DIR [DB]  print the URL
#   pg-local.sh status DIR       exit 0 when it runs, 3 when it does not
#
# The server listens on 127.0.0.1 only, at $PGPORT (default 55432), with its
# unix socket in DIR, and trusts every local connection: it is for demos and
# tests, never for data you want to keep. Run as root, the server runs as the
# postgres user (PostgreSQL refuses to run as root) and DIR is given to it.
# Extra server settings: PG_LOCAL_OPTS="-c fsync=off". Binaries: the newest
# /usr/lib/postgresql/*/bin (Debian's layout), or PG_BINDIR.
set -euo pipefail

DEFAULT_PORT=55432

die() {
	echo "pg-local: $*" >&2
	exit 1
}

note() {
	echo "pg-local: $*" >&2
}

usage() {
	sed -n '2,10s/^# \{0,1\}//p' "$0" >&2
	exit 2
}

find_bindir() {
	if [ -n "${PG_BINDIR:-}" ]; then
		[ -x "$PG_BINDIR/pg_ctl" ] || die "PG_BINDIR=$PG_BINDIR has no pg_ctl"
		echo "$PG_BINDIR"
		return
	fi
	local d
	d=$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '[*]' | sort -V | tail -n 1 || true)
	if [ -z "$d" ] && command -v pg_config >/dev/null 2>&1; then
		d=$(pg_config --bindir)
	fi
	if [ -z "$d" ] || [ ! -x "$d/initdb" ] || [ ! -x "$d/pg_ctl" ]; then
		die "no PostgreSQL server binaries found (apt-get install postgresql, or set PG_BINDIR)"
	fi
	echo "$d"
}

# Runs a command as the cluster's owner: postgres when we are root.
as_owner() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

port_busy() {
	timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

valid_port() {
	[[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]
}

# Prints the absolute path of $1, creating it first if asked to.
absdir() {
	local dir=$1 create=${2:-}
	if [ -n "$create" ]; then
		mkdir -p "$dir"
	fi
	[ -d "$dir" ] || return 1
	(cd "$dir" && pwd -P)
}

is_running() {
	[ -f "$DATA/postmaster.pid" ] || return 1
	as_owner "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1
}

# The port of the running server, from its postmaster.pid (4th line).
running_port() {
	sed -n 4p "$DATA/postmaster.pid" 2>/dev/null
}

check_db_name() {
	[[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "bad database name: $1"
}

give_to_owner() {
	[ "$(id -u)" -eq 0 ] || return 0
	id postgres >/dev/null 2>&1 || die "running as root needs a postgres user (apt-get install postgresql)"
	chown -R postgres: "$DIR"
	runuser -u postgres -- test -w "$DIR" ||
		die "the postgres user cannot reach $DIR (a parent directory is not searchable); use a directory under /tmp or /srv"
}

init_cluster() {
	note "creating a cluster in $DATA"
	if ! as_owner "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale \
		--no-sync >"$DIR/initdb.log" 2>&1; then
		cat "$DIR/initdb.log" >&2
		die "initdb failed"
	fi
}

start_server() {
	local port=$1 sock=$DIR
	# A unix socket path is limited to 107 bytes; past that, TCP only.
	if [ $((${#DIR} + ${#port} + 10)) -gt 100 ]; then
		sock=""
	fi
	note "starting PostgreSQL on 127.0.0.1:$port (log: $DIR/postgres.log)"
	# Its own session, so a Ctrl-C meant for the demo does not reach the
	# server: it is stopped on purpose with `stop`.
	if ! as_owner setsid -w "$BIN/pg_ctl" start -D "$DATA" -l "$DIR/postgres.log" -w -t 60 -s \
		-o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories='$sock' ${PG_LOCAL_OPTS:-}" >&2; then
		tail -n 20 "$DIR/postgres.log" >&2 || true
		die "PostgreSQL did not start"
	fi
}

create_db() {
	local port=$1 db=$2 found
	found=$("$BIN/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
		"SELECT 1 FROM pg_database WHERE datname = '$db'") ||
		die "cannot connect to the server on port $port"
	[ "$found" = 1 ] && return 0
	"$BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres "$db" || die "createdb $db failed"
}

print_url() {
	echo "postgresql://postgres@127.0.0.1:$1/$2"
}

cmd_start() {
	local port db=${1:-idemproxy}
	check_db_name "$db"
	if is_running; then
		port=$(running_port)
		note "already running on 127.0.0.1:$port"
	else
		port=${PGPORT:-$DEFAULT_PORT}
		valid_port "$port" || die "bad PGPORT: $port"
		if port_busy "$port"; then
			die "port $port on 127.0.0.1 is already in use; stop what listens there or set PGPORT"
		fi
		give_to_owner
		[ -s "$DATA/PG_VERSION" ] || init_cluster
		start_server "$port"
	fi
	create_db "$port" "$db"
	print_url "$port" "$db"
}

cmd_stop() {
	if ! is_running; then
		note "not running in $DIR"
		return 0
	fi
	if ! as_owner "$BIN/pg_ctl" stop -D "$DATA" -m fast -w -t 60 -s >&2; then
		# It may have died on its own meanwhile; that is what we wanted.
		is_running && die "pg_ctl stop failed"
	fi
	note "stopped the cluster in $DIR"
}

cmd_url() {
	local db=${1:-idemproxy} port
	check_db_name "$db"
	if is_running; then
		port=$(running_port)
	else
		port=${PGPORT:-$DEFAULT_PORT}
		note "not running in $DIR"
	fi
	print_url "$port" "$db"
}

main() {
	[ $# -ge 2 ] || usage
	local cmd=$1
	BIN=$(find_bindir)
	case "$cmd" in
	start)
		DIR=$(absdir "$2" create) || die "cannot create $2"
		;;
	stop | url | status)
		DIR=$(absdir "$2") || DIR=$2
		;;
	*)
		usage
		;;
	esac
	DATA=$DIR/data
	shift 2
	# The postgres user may not be allowed into the caller's directory.
	cd /
	case "$cmd" in
	start) cmd_start "$@" ;;
	stop) cmd_stop ;;
	url) cmd_url "$@" ;;
	status) is_running || exit 3 ;;
	esac
}

main "$@"
