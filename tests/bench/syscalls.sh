#!/usr/bin/env bash
# `make bench-syscalls`: system calls and context switches of idemproxy per
# fresh-key request, the kernel-side half of a request's cost (callgrind,
# `make bench-profile`, counts the instructions).
#
# idemproxy (the bench's configuration: BENCH_WORKERS workers, log_level
# warn, busy_poll off) in front of the stub, PostgreSQL with fsync on.
# For one connection (requests one at a time) and for BENCH_SYSCALLS_CONNS
# connections, tests/bench/clients/client.py sends N fresh keys, checking every
# answer, twice:
#   1. counted by `perf stat -p` (raw_syscalls:sys_enter, context-switches,
#      cpu-migrations) and by the voluntary and nonvoluntary context
#      switches of every thread in /proc/PID/task/*/status;
#   2. under `strace -c -f -p`, for the calls by name (strace stops the
#      proxy at every call, so its timing is not the proxy's; its counts
#      are).
# Then the proxy is restarted with log_level info (a line per request, the
# default) and the same phases run under strace -c -f once more: their
# write(2) calls per request are what the request log costs in system
# calls (log_flush_interval, doc/operations.md "Logs").
# Each count is the phase's minus what the idle proxy does in as many
# seconds (measured the same way first), divided by N.
#
# Output: build-bench/syscalls.txt; the tools' output in
# build-bench/logs/syscalls/. Environment: BENCH_SYSCALLS_N (2000),
# BENCH_SYSCALLS_CONNS (16), BENCH_SYSCALLS_IDLE_S (3), BENCH_WORKERS (16).
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${BENCH_OUT:-build-bench}
BIN=${BENCH_BIN:-$OUT/bin}
N=${BENCH_SYSCALLS_N:-2000}
CONNS=${BENCH_SYSCALLS_CONNS:-16}
IDLE_S=${BENCH_SYSCALLS_IDLE_S:-3}
WORKERS=${BENCH_WORKERS:-16}
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3
HERE=tests/bench
LOGS=$OUT/logs/syscalls
REPORT=$OUT/syscalls.txt
TAG=s$(date +%s)
START_S=$SECONDS

TMP=""
PG_DIR=""
STUB_PID=""
PROXY_PID=""
TRACER_PID=""

# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	stop_pid "$TRACER_PID" INT
	stop_pid "$PROXY_PID"
	stop_pid "$STUB_PID"
	[ -z "$PG_DIR" ] || scripts/pg-local.sh stop "$PG_DIR" >/dev/null 2>&1
	[ -z "$TMP" ] || rm -rf "$TMP"
	exit "$rc"
}

now() {
	date +%s.%N
}

# The voluntary and nonvoluntary context switches of all the proxy's
# threads so far, as "VOLUNTARY NONVOLUNTARY".
ctxt() {
	cat /proc/"$PROXY_PID"/task/*/status 2>/dev/null | awk '
		/^voluntary_ctxt_switches:/ { v += $2 }
		/^nonvoluntary_ctxt_switches:/ { n += $2 }
		END { print v + 0, n + 0 }'
}

# What one phase does: "idle SECONDS" or "CONNS" (N fresh keys on that many
# connections). Sets PHASE_S.
SEQ=0
phase() {
	SEQ=$((SEQ + 1))
	local t0
	t0=$(now)
	if [ "$1" = idle ]; then
		sleep "$2"
	else
		"$PYTHON" "$HERE/clients/client.py" "$PROXY_PORT" forward "$N" "$TAG-$SEQ" "$1" ||
			die "the client's fresh keys did not all get a forwarded 201"
	fi
	PHASE_S=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
}

# counted NAME WHAT...: phase WHAT under perf stat and /proc; writes
# NAME.counts ("event count" lines, and "seconds S").
counted() {
	local name=$1 c0 c1 file=$TMP/$1.counts
	shift
	c0=$(ctxt)
	perf stat -x, -e raw_syscalls:sys_enter,context-switches,cpu-migrations \
		-p "$PROXY_PID" -o "$LOGS/$name.perf" &
	TRACER_PID=$!
	sleep 0.3
	phase "$@"
	stop_pid "$TRACER_PID" INT
	TRACER_PID=""
	c1=$(ctxt)
	{
		awk -F, '$3 != "" && $1 ~ /^[0-9]+$/ { print $3, $1 }' "$LOGS/$name.perf"
		echo "voluntary $((${c1% *} - ${c0% *}))"
		echo "nonvoluntary $((${c1#* } - ${c0#* }))"
		echo "seconds $PHASE_S"
	} >"$file"
}

# traced NAME WHAT...: phase WHAT under strace -c -f; writes NAME.counts
# ("syscall calls" lines, and "seconds S").
traced() {
	local name=$1
	shift
	strace -c -f -p "$PROXY_PID" -o "$LOGS/$name.strace" 2>"$LOGS/$name.strace.err" &
	TRACER_PID=$!
	# "Process P attached with T threads", once all are.
	for _ in $(seq 100); do
		grep -q attached "$LOGS/$name.strace.err" && break
		sleep 0.05
	done
	phase "$@"
	stop_pid "$TRACER_PID" INT
	TRACER_PID=""
	{
		# % time, seconds, usecs/call, calls, [errors,] syscall
		awk '/^-----/ { on++; next } on == 1 && NF >= 5 { print $NF, $4 }' \
			"$LOGS/$name.strace"
		echo "seconds $PHASE_S"
	} >"$TMP/$name.counts"
}

main() {
	for tool in perf strace curl; do
		command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run \`make bench-deps\`"
	done
	[ -x "$BIN/idemproxy" ] && [ -x "$BIN/stub_upstream" ] || die "run \`make bench-syscalls\` (it builds $BIN first)"
	mkdir -p "$LOGS"
	rm -f "$LOGS"/* "$REPORT"
	TMP=$(mktemp -d /tmp/idemproxy-syscalls.XXXXXX)
	chmod 755 "$TMP"
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	start_pg "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
	start_stub
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	migrate
	start_proxy warn
	note "idemproxy, $WORKERS workers; $N fresh keys per phase, at 1 and $CONNS connections"
	# Warm: every worker's connection and statements.
	"$PYTHON" "$HERE/clients/client.py" "$PROXY_PORT" forward 500 "$TAG-warm" "$CONNS" ||
		die "the warm-up failed"

	counted idle-perf idle "$IDLE_S"
	traced idle-strace idle "$IDLE_S"
	local c
	for c in 1 "$CONNS"; do
		note "$c connection(s): perf stat and /proc"
		counted "c$c-perf" "$c"
		note "$c connection(s): strace -c -f"
		traced "c$c-strace" "$c"
	done
	stop_pid "$PROXY_PID"
	PROXY_PID=""

	start_proxy info
	note "log_level info: strace -c -f, for the request log's write(2) calls"
	"$PYTHON" "$HERE/clients/client.py" "$PROXY_PORT" forward 500 "$TAG-warm-info" "$CONNS" ||
		die "the warm-up failed"
	for c in 1 "$CONNS"; do
		traced "info-c$c-strace" "$c"
	done
	stop_pid "$PROXY_PID"
	PROXY_PID=""

	local stats
	stats=$(stub_ctl GET stats)
	note "upstream saw $stats"
	[ "$(sed -n 's/.*"duplicated_keys":\([0-9]*\).*/\1/p' <<<"$stats")" = 0 ] ||
		die "a key reached the upstream twice: $stats"
	[ "$(sed -n 's/.*"keys":\([0-9]*\).*/\1/p' <<<"$stats")" = $((1000 + 6 * N)) ] ||
		die "the upstream did not see each of the $((1000 + 6 * N)) keys: $stats"

	"$PYTHON" - "$TMP" "$N" "$CONNS" "$WORKERS" >"$REPORT" <<'EOF'
import os
import sys

tmp, n, conns, workers = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
    sys.argv[4]


def load(name):
    d = {}
    with open(os.path.join(tmp, name + ".counts")) as f:
        for line in f:
            k, v = line.split()
            d[k] = float(v)
    return d


def per_request(phase, idle, key):
    rate = idle.get(key, 0) / idle["seconds"]
    return (phase.get(key, 0) - rate * phase["seconds"]) / n


ip, it = load("idle-perf"), load("idle-strace")
cols = ["1", conns]
print("idemproxy system calls and context switches per fresh-key request")
print("(%d requests per phase, %s workers, log_level warn, busy_poll off;"
      % (n, workers))
print("each count minus the idle proxy's over as many seconds, over %d)" % n)
print()
print("%-34s %12s %12s" % ("per request", "1 conn", conns + " conns"))
rows = [("system calls (perf)", "raw_syscalls:sys_enter"),
        ("context switches (perf)", "context-switches"),
        ("  voluntary (/proc, all threads)", "voluntary"),
        ("  nonvoluntary (/proc)", "nonvoluntary"),
        ("cpu migrations (perf)", "cpu-migrations")]
phases = {c: load("c%s-perf" % c) for c in cols}
for label, key in rows:
    print("%-34s %12.1f %12.1f" % (label, per_request(phases[cols[0]], ip, key),
                                   per_request(phases[cols[1]], ip, key)))
print("%-34s %12.0f %12.0f" % ("requests per second (perf phase)",
                               n / phases[cols[0]]["seconds"],
                               n / phases[cols[1]]["seconds"]))
print("idle proxy, per second: %.1f system calls, %.1f context switches"
      % (ip.get("raw_syscalls:sys_enter", 0) / ip["seconds"],
         ip.get("context-switches", 0) / ip["seconds"]))
print()
traced = {c: load("c%s-strace" % c) for c in cols}
names = set()
for d in traced.values():
    names.update(k for k in d if k not in ("seconds", "total"))
print("strace -c -f: calls per request by system call")
print("%-24s %12s %12s" % ("syscall", "1 conn", conns + " conns"))
total = {c: 0.0 for c in cols}
lines = []
for name in names:
    v = [per_request(traced[c], it, name) for c in cols]
    for c, x in zip(cols, v):
        total[c] += x
    lines.append((v[1], v[0], name))
for v16, v1, name in sorted(lines, reverse=True):
    if abs(v1) >= 0.05 or abs(v16) >= 0.05:
        print("%-24s %12.2f %12.2f" % (name, v1, v16))
print("%-24s %12.2f %12.2f" % ("total", total[cols[0]], total[cols[1]]))
print()
info = {c: load("info-c%s-strace" % c) for c in cols}
print("log_level info (a line per request): strace -c -f, per request")
print("%-24s %12s %12s" % ("syscall", "1 conn", conns + " conns"))
v = [per_request(info[c], it, "write") for c in cols]
print("%-24s %12.3f %12.3f" % ("write", v[0], v[1]))
v = [per_request(info[c], it, "write") - per_request(traced[c], it, "write")
     for c in cols]
print("%-24s %12.3f %12.3f" % ("  minus warn's: the log", v[0], v[1]))
v = [sum(per_request(info[c], it, k) for k in info[c] if k not in ("seconds", "total"))
     for c in cols]
print("%-24s %12.2f %12.2f" % ("total", v[0], v[1]))
EOF
	cat "$REPORT"
	note "written to $REPORT"
}

main "$@"
