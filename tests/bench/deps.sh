#!/bin/sh
# Installs what the benchmark needs besides the build's own packages, if any
# is missing: nginx (the reference proxy), wrk (the load), pgbench (in
# postgresql-contrib), valgrind (bench-profile). Needs root (or sudo) only
# when something is missing.
set -eu
cd "$(dirname "$0")/../.."
scripts/deps.sh
PKGS="nginx wrk postgresql-contrib valgrind curl procps"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
