#!/bin/sh
# Installs the Debian packages the build, the tests and the demo need, if any
# is missing. Needs root (or sudo) only when something is missing.
set -eu
PKGS="build-essential pkg-config xxd libmicrohttpd-dev libcurl4-openssl-dev libpq-dev
libjansson-dev libssl-dev libconfig-dev libcmocka-dev postgresql postgresql-contrib
python3 python3-pytest python3-psycopg python3-requests curl procps
clang libclang-rt-14-dev prometheus systemd"
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
