#!/bin/sh
# Installs what the benchmark needs besides the build's own packages, if any
# is missing: nginx (the reference proxy), wrk (the load), pgbench (in
# postgresql-contrib), valgrind (bench-profile), strace and perf
# (bench-syscalls). Needs root (or sudo) only when something is missing.
set -eu
cd "$(dirname "$0")/../.."
scripts/deps.sh
exec scripts/apt-install.sh nginx wrk postgresql-contrib valgrind strace linux-perf curl procps
