#!/bin/sh
# apt-install.sh PACKAGE...: installs those of the named Debian packages that
# are missing (apt-get update first, once). Needs root or sudo only when
# something is missing. Shared by scripts/deps.sh, tests/bench/deps.sh and
# docker/build.sh.
set -eu
missing=""
for p in "$@"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # a list of package names
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
