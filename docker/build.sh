#!/bin/sh
# Builds idemproxy from this checkout and installs it under PREFIX.
#
#   docker/build.sh [PREFIX]      build, then install (default PREFIX /usr/local):
#                                   PREFIX/bin/idemproxy
#                                   PREFIX/share/idemproxy/idemproxy.conf.example
#                                   PREFIX/share/idemproxy/demo_upstream.py
#   docker/build.sh --deps-only   only install the Debian build dependencies
#
# The build dependencies are installed when missing (that needs root or sudo).
# The Dockerfile's build stage runs this script; it works the same on any
# Debian 12 machine. BUILD=DIR builds in DIR instead of build/.
set -eu

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/build}
install_deps() {
	"$SRC/scripts/apt-install.sh" build-essential pkg-config xxd \
		libmicrohttpd-dev libcurl4-openssl-dev libpq-dev libjansson-dev \
		libssl-dev libconfig-dev libjose-dev libjemalloc-dev libsystemd-dev
}

install_deps
[ "${1:-}" = "--deps-only" ] && exit 0

PREFIX=${1:-/usr/local}
make -C "$SRC" --no-print-directory BUILD="$BUILD" -j"$(nproc)" "$BUILD/idemproxy"
# The binary must at least run, and the container's conf must validate.
"$BUILD/idemproxy" --version
"$BUILD/idemproxy" -c "$SRC/docker/idemproxy.conf" --check >/dev/null

install -d "$PREFIX/bin" "$PREFIX/share/idemproxy"
install -m 0755 -s "$BUILD/idemproxy" "$PREFIX/bin/idemproxy"
install -m 0644 "$SRC/conf/idemproxy.conf" "$PREFIX/share/idemproxy/idemproxy.conf.example"
install -m 0755 "$SRC/demo/upstream.py" "$PREFIX/share/idemproxy/demo_upstream.py"
echo "build.sh: installed $PREFIX/bin/idemproxy"
