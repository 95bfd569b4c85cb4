#!/usr/bin/env bash
# The local demo behind `make run`: a throwaway PostgreSQL and the demo
# payments API (demo/upstream.py) in the background, the schema
# migrated, then idemproxy in the foreground with conf/idemproxy.conf.
# Ctrl-C stops all three. State lives in .run/ (`make clean` removes it).
#
# `demo/run.sh --curl` only prints the walk-through (a curl command for
# every route of the conf) and exits.
#
# Environment: IDEMPROXY_CONF (default conf/idemproxy.conf), PGPORT (default
# 55432), IDEMPROXY_LISTEN (as for idemproxy itself).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
RUN=$ROOT/.run
BIN=$ROOT/build/idemproxy
CONF=${IDEMPROXY_CONF:-conf/idemproxy.conf}
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3
export PGPORT=${PGPORT:-55432}

UP_PID=""
TAIL_PID=""
PG_DIR=""

die() {
	echo "demo: $*" >&2
	exit 1
}

note() {
	echo "demo: $*" >&2
}

# The first "quoted" value of setting $1 at the start of a line of the conf.
conf_value() {
	sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"\([^\"]*\)\".*/\1/p" "$CONF" | head -n 1
}

port_busy() {
	timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# Says who holds a busy port, when ss can tell.
who_listens() {
	command -v ss >/dev/null 2>&1 || return 0
	ss -Hltnp "sport = :$1" 2>/dev/null | sed 's/^/    /' >&2 || true
}

require_free() {
	local port=$1 what=$2
	port_busy "$port" || return 0
	note "port $port ($what) is already in use:"
	who_listens "$port"
	BUSY=1
}

# A host:port of the conf as a URL a client on this machine can use.
local_url() {
	local hostport=$1 host port
	port=${hostport##*:}
	host=${hostport%:*}
	case "$host" in
	"" | 0.0.0.0 | "*") host=127.0.0.1 ;;
	"[::]") host="[::1]" ;;
	esac
	echo "http://$host:$port"
}

# As root, PostgreSQL runs as the postgres user, which cannot enter a
# checkout under a private home directory (/root is 0700): the cluster then
# lives under /var/tmp, linked from .run/pg.
pick_pg_dir() {
	local dir=$RUN/pg alt
	if [ "$(id -u)" -ne 0 ] || runuser -u postgres -- test -x "$RUN"; then
		echo "$dir"
		return
	fi
	alt=/var/tmp/idemproxy-demo-pg-$(echo "$ROOT" | md5sum | cut -c1-8)
	mkdir -p "$alt"
	[ -L "$dir" ] || { rm -rf "$dir" && ln -s "$alt" "$dir"; }
	note "the postgres user cannot enter $ROOT; the demo database lives in $alt"
	echo "$dir"
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	echo >&2
	if [ -n "$UP_PID" ]; then
		kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
		note "stopped the demo upstream"
	fi
	if [ -n "$TAIL_PID" ]; then
		kill "$TAIL_PID" 2>/dev/null
		wait "$TAIL_PID" 2>/dev/null
	fi
	if [ -n "$PG_DIR" ]; then
		"$ROOT/scripts/pg-local.sh" stop "$PG_DIR"
	fi
	exit "$rc"
}

start_upstream() {
	local port=$1
	: >"$RUN/upstream.log"
	"$PYTHON" -u demo/upstream.py --host 127.0.0.1 --port "$port" \
		>>"$RUN/upstream.log" 2>&1 </dev/null &
	UP_PID=$!
	# Show what the upstream executes, interleaved with the proxy's log.
	tail -n +1 -F --pid=$$ "$RUN/upstream.log" 2>/dev/null | sed -u 's/^/upstream| /' &
	TAIL_PID=$!
	for _ in $(seq 50); do
		curl -fsS -o /dev/null "http://127.0.0.1:$port/__demo/stats" 2>/dev/null && return 0
		kill -0 "$UP_PID" 2>/dev/null || break
		sleep 0.1
	done
	UP_PID=""
	die "the demo upstream did not start (see $RUN/upstream.log)"
}

banner() {
	local p=$1 admin=$2 up=$3 db=$4 k n json
	n=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
	k=order-$n
	json="-H 'Content-Type: application/json'"
	cat <<EOF

================================ idemproxy demo ================================
  proxy     $p  ->  demo payments API $up
  database  $db
${admin:+  admin     $admin/metrics  $admin/healthz  $admin/readyz
}
Try these in another terminal. Lines starting with "upstream|" below are what
the payments API really executed: a replayed retry adds none.

1. Create a payment: forwarded, executed once upstream, 201.
   curl -i $p/v1/payments -H 'Idempotency-Key: $k-1' $json -d '{"amount": 2000, "currency": "usd"}'

2. Retry it (the same command): the stored 201 is replayed with
   "Idempotent-Replayed: true", same payment id, no new "upstream|" line.

3. Same key, different amount: 409 idempotency_key_mismatch.
   curl -i $p/v1/payments -H 'Idempotency-Key: $k-1' $json -d '{"amount": 2500, "currency": "usd"}'

4. No key: 400 idempotency_key_missing, nothing executed.
   curl -i $p/v1/payments $json -d '{"amount": 2000, "currency": "usd"}'

5. A retry while the first attempt is still running: 409 idempotency_key_in_use
   with Retry-After. "Slow: 5" makes the demo upstream take 5 seconds:
   curl -s -o /dev/null -w 'first attempt: %{http_code}\\n' $p/v1/payments -H 'Idempotency-Key: $k-2' -H 'Slow: 5' $json -d '{"amount": 900, "currency": "usd"}' & sleep 1; curl -i $p/v1/payments -H 'Idempotency-Key: $k-2' $json -d '{"amount": 900, "currency": "usd"}'; wait
   (or run the two halves in two terminals). Run the second half again after
   5 seconds: now it is a replay.

6. A decline is an answer too: amount 4000402 gets 402 card_declined, which is
   recorded and replayed (run it twice: one "upstream|" line).
   curl -i $p/v1/payments -H 'Idempotency-Key: $k-3' $json -d '{"amount": 4000402, "currency": "usd"}'

7. Capture the payment of step 1 (a replay of step 1 gives its id), twice:
   the second capture is a replay, not the upstream's "already captured".
   PAY=\$(curl -s $p/v1/payments -H 'Idempotency-Key: $k-1' $json -d '{"amount": 2000, "currency": "usd"}' | sed -n 's/.*"id": "\\(pay_[^"]*\\)".*/\\1/p')
   curl -i -X POST $p/v1/payments/\$PAY/capture -H "Idempotency-Key: capture-\$PAY"

8. A GET needs no key and passes straight through:
   curl -i $p/v1/payments

9. Refund part of that payment (run step 7's PAY= line first); a retry is a
   replay, not a second refund:
   curl -i $p/v1/refunds -H "Idempotency-Key: refund-\$PAY" $json -d "{\\"payment\\": \\"\$PAY\\", \\"amount\\": 500}"

10. A PSP's webhook carries no Idempotency-Key: the route keys it by the event
    id in its body (key_from = ["body:/event/id"]). Send it twice: one
    "upstream|" line, then a replay.
   curl -i $p/hooks/psp $json -d '{"event": {"id": "evt_$n", "type": "payment.succeeded"}}'

11. A bank's webhook is keyed by its X-Delivery-Id header instead:
   curl -i $p/hooks/bank -H 'X-Delivery-Id: dlv-$n' $json -d '{"status": "settled"}'

12. An order's transition is keyed by order and status from the body, and
    "sent_at" is left out of the fingerprint: resent with another sent_at,
    it is a replay, not a 409.
   curl -i $p/v1/orders/ord_$n/transitions $json -d '{"order_id": "ord_$n", "status": "shipped", "sent_at": "2026-01-01T10:00:00Z"}'

13. What the upstream executed, per key and per path:   curl -s $up/__demo/stats
EOF
	if [ -n "$admin" ]; then
		echo "   The proxy's counters:  curl -s $admin/metrics | grep '^idemproxy_requests_total'"
	fi
	cat <<EOF

Ctrl-C stops idemproxy, the demo upstream and PostgreSQL.
================================================================================

EOF
}

main() {
	local listen admin upstream up_port db_url proxy_url admin_url="" rc=0
	[ -x "$BIN" ] || die "build/idemproxy is missing: run \`make run\` (or \`make\` first)"
	[ -f "$CONF" ] || die "$CONF is missing"
	command -v curl >/dev/null 2>&1 || die "curl is missing: run \`make deps\`"

	listen=${IDEMPROXY_LISTEN:-$(conf_value listen)}
	listen=${listen:-127.0.0.1:8080}
	admin=$(conf_value admin_listen)
	upstream=$(grep -o 'upstream[[:space:]]*=[[:space:]]*"[^"]*"' "$CONF" | head -n 1 |
		sed 's/.*"\(.*\)"/\1/')
	upstream=${upstream:-http://127.0.0.1:9000}
	case "$upstream" in
	http://127.0.0.1:* | http://localhost:*) ;;
	*) die "$CONF sends requests to $upstream; the demo upstream runs on 127.0.0.1" ;;
	esac
	up_port=${upstream#http://*:}
	up_port=${up_port%%/*}
	proxy_url=$(local_url "$listen")
	[ -z "$admin" ] || admin_url=$(local_url "$admin")
	if [ "${1:-}" = "--curl" ]; then
		banner "$proxy_url" "$admin_url" "http://127.0.0.1:$up_port" \
			"${IDEMPROXY_DATABASE_URL:-(started by demo/run.sh)}"
		return 0
	fi

	BUSY=0
	require_free "${listen##*:}" "idemproxy listen"
	[ -z "$admin" ] || require_free "${admin##*:}" "idemproxy admin_listen"
	require_free "$up_port" "demo upstream"
	[ "$BUSY" = 0 ] || die "stop what holds these ports (an earlier demo?) and run again"

	"$BIN" -c "$CONF" --check >/dev/null || die "$CONF does not pass idemproxy --check"

	mkdir -p "$RUN"
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	PG_DIR=$(pick_pg_dir)
	db_url=$(scripts/pg-local.sh start "$PG_DIR")
	export IDEMPROXY_DATABASE_URL=$db_url

	start_upstream "$up_port"
	note "migrating $db_url"
	"$BIN" -c "$CONF" --migrate || die "idemproxy --migrate failed"

	echo
	"$BIN" -c "$CONF" --check
	banner "$proxy_url" "$admin_url" "http://127.0.0.1:$up_port" "$db_url"

	# From here Ctrl-C is idemproxy's to handle (a graceful stop); the
	# script only waits for it and then cleans up.
	trap ':' INT
	"$BIN" -c "$CONF" || rc=$?
	[ "$rc" = 0 ] || note "idemproxy exited with status $rc"
	return "$rc"
}

main "$@"
